package wal_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/pipeline"
)

// TestMillionRowTransaction streams one transaction of 100,000 outbox
// rows (1,000,000 with RELAY_BIG=1) through the pipeline, ten times the
// pipeline's window, and checks that every event arrives once in
// per-aggregate order, that the outbox ends archived, and that the peak
// RSS (VmHWM) of the process stays under 200 MB. The large size takes about
// a minute: run it alone,
//
//	RELAY_BIG=1 go test -run TestMillionRowTransaction -v -timeout 20m ./capture/wal/
func TestMillionRowTransaction(t *testing.T) {
	rows, aggregates := 100_000, 1000
	if os.Getenv("RELAY_BIG") != "" {
		rows = 1_000_000
	}
	pool := setup(t, layout)
	o := options(t, pool, layout, 500)
	o.StatusInterval = 10 * time.Second
	o.Logger = discard()
	src := newStreaming(t, o)
	before := testenv.PeakRSS(t, os.Getpid())

	snk := newOrderSink(rows, aggregates)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := pipeline.New(src, snk, pipeline.Options{Logger: discard(), MaxInFlight: 10000, BatchSize: 500})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var maxInFlight atomic.Int64
	go func() { // the sink is slower than the stream: the window fills
		for ctx.Err() == nil {
			if n := p.Stats().InFlight.Load(); n > maxInFlight.Load() {
				maxInFlight.Store(n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	start := time.Now()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || (i % 1000), 'step',
		       jsonb_build_object('i', i, 'pad', repeat('x', 100))
		FROM generate_series(0, $1::int - 1) AS i`, rows)
	inserted := time.Since(start)
	waitFor(t, 15*time.Minute, "every event published", func() bool { return snk.distinct() == rows })
	published := time.Since(start)
	waitFor(t, 5*time.Minute, "the outbox archived", func() bool { return count(t, pool, "outbox") == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := snk.err(); err != nil {
		t.Fatal(err)
	}
	peak := testenv.PeakRSS(t, os.Getpid())
	t.Logf("%d-row transaction: inserted in %s, published in %s, archived in %s; %d duplicates; "+
		"at most %d events in flight; peak RSS %d MB (%d MB before streaming)",
		rows, inserted.Round(time.Second), published.Round(time.Second), time.Since(start).Round(time.Second),
		snk.dups, maxInFlight.Load(), peak>>20, before>>20)
	if peak > 200<<20 {
		t.Fatalf("peak RSS %d MB, want under 200 MB", peak>>20)
	}
}

// orderSink checks, with fixed memory, that each row i arrives and that
// each aggregate's rows arrive in increasing i on first delivery.
type orderSink struct {
	mu    sync.Mutex
	seen  []uint64 // bitset over i
	last  []int    // per aggregate: the last i first delivered
	n     int
	dups  int
	aggs  int
	first error
}

func newOrderSink(rows, aggs int) *orderSink {
	s := &orderSink{seen: make([]uint64, rows/64+1), last: make([]int, aggs), aggs: aggs}
	for i := range s.last {
		s.last[i] = -1
	}
	return s
}

func (s *orderSink) Publish(_ context.Context, batch []*event.Event) error {
	time.Sleep(5 * time.Millisecond) // a broker round trip
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range batch {
		var body struct{ I int }
		if err := json.Unmarshal(ev.Payload, &body); err != nil {
			s.fail(err)
			continue
		}
		if s.seen[body.I/64]&(1<<(body.I%64)) != 0 {
			s.dups++
			continue
		}
		s.seen[body.I/64] |= 1 << (body.I % 64)
		s.n++
		agg := body.I % s.aggs
		if ev.AggregateID != "agg-"+strconv.Itoa(agg) {
			s.fail(strconvErr("aggregate_id " + ev.AggregateID + " does not match row " + strconv.Itoa(body.I)))
		}
		if body.I < s.last[agg] {
			s.fail(strconvErr("row " + strconv.Itoa(body.I) + " after row " + strconv.Itoa(s.last[agg])))
		}
		s.last[agg] = body.I
	}
	return nil
}

func (s *orderSink) fail(err error) {
	if s.first == nil {
		s.first = err
	}
}

func (s *orderSink) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (s *orderSink) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

func (s *orderSink) Close() error { return nil }

type strconvErr string

func (e strconvErr) Error() string { return string(e) }

package wal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/pipeline"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var layout = outboxtest.Layout()

// setup creates the outbox of layout l in a fresh database and returns a
// pool on it.
func setup(t testing.TB, l schema.Layout) *pgxpool.Pool { return outboxtest.DB(t, l, nil) }

var mustExec = outboxtest.Exec

var slotSeq atomic.Int64

// newSlotName returns a slot name unique in the shared cluster.
func newSlotName() string { return fmt.Sprintf("relay_test_%d", slotSeq.Add(1)) }

// testLog is a logger writing to the test's log until the test ends.
func testLog(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// options returns source options for tests: a fresh slot, fast status
// updates.
func options(t testing.TB, pool *pgxpool.Pool, l schema.Layout, batch int) wal.Options {
	return wal.Options{Pool: pool, Layout: table.Layout(l), Slot: newSlotName(), Publication: "relay_pub", BatchSize: batch,
		StatusInterval: 100 * time.Millisecond, GuardInterval: 100 * time.Millisecond, Logger: testLog(t)}
}

// quietStatus spaces o's status updates out beyond any test: the status
// interval is an hour and wal_sender_timeout ten minutes, so the source's
// periodic update (at a third of wal_sender_timeout) is 200 s away. It
// sets o.ReplConfig to a copy of the pool's connection config.
func quietStatus(o *wal.Options) {
	o.StatusInterval = time.Hour
	o.ReplConfig = &o.Pool.Config().ConnConfig.Config
	o.ReplConfig.RuntimeParams["wal_sender_timeout"] = "10min"
}

func newSource(t testing.TB, o wal.Options) *wal.Source {
	t.Helper()
	src, err := wal.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// newStreaming returns a source that created its slot and streams, so rows
// inserted from now on come from the stream rather than a drain. It waits
// for the source's stream, not only for the slot to be active: the slot is
// active from the walsender's START_REPLICATION on, and a Next cancelled
// before the answer reached the source opened no stream, which a test that
// does not call Next again would never get.
func newStreaming(t testing.TB, o wal.Options) *wal.Source {
	t.Helper()
	src := newSource(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan capture.Batch, 1)
	go func() {
		b, _ := src.Next(ctx)
		done <- b
	}()
	waitFor(t, 10*time.Second, "the source to stream", func() bool {
		return wal.Streaming(src) && slotActive(t, o.Pool, o.Slot)
	})
	cancel()
	if b := <-done; b != nil {
		t.Fatalf("unexpected batch %v", ids(b.Events()))
	}
	return src
}

// slotActive reports whether a walsender streams from slot.
func slotActive(t testing.TB, q schema.Querier, slot string) bool {
	t.Helper()
	var active bool
	err := q.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
		JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1)`, slot).Scan(&active)
	if err != nil {
		t.Fatal(err)
	}
	return active
}

func insert(t testing.TB, q schema.Querier, agg string, step int) string {
	t.Helper()
	id := uuid.NewString()
	mustExec(t, q, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, 'order', $2, 'step', $3, '{"trace":"t"}')`, id, agg, fmt.Sprintf(`{"aggregate":%q,"step":%d}`, agg, step))
	return id
}

// next returns the next batch, waiting at most d; nil when none came.
func next(t testing.TB, src *wal.Source, d time.Duration) capture.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	b, err := src.Next(ctx)
	if err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	return b
}

// collect takes batches until n events arrived, failing after d.
func collect(t testing.TB, src *wal.Source, n int, d time.Duration) []capture.Batch {
	t.Helper()
	var out []capture.Batch
	deadline := time.Now().Add(d)
	for got := 0; got < n; {
		b := next(t, src, time.Until(deadline))
		if b == nil {
			t.Fatalf("got %d of %d events in %s", got, n, d)
		}
		out = append(out, b)
		got += len(b.Events())
	}
	return out
}

func events(bs []capture.Batch) []*event.Event {
	var out []*event.Event
	for _, b := range bs {
		out = append(out, b.Events()...)
	}
	return out
}

func ids(evs []*event.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func complete(t testing.TB, b capture.Batch) {
	t.Helper()
	if err := b.Complete(context.Background(), capture.Outcome{Published: b.Events()}); err != nil {
		t.Fatal(err)
	}
}

func count(t testing.TB, q schema.Querier, table string) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// confirmed returns the slot's confirmed_flush_lsn.
func confirmed(t testing.TB, q schema.Querier, slot string) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := q.QueryRow(context.Background(), `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// waitFor polls cond every 20ms until it holds, failing after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recorder is a sink that records every delivery in a verify.Log, in
// arrival order.
type recorder struct {
	log *verify.Log
	n   atomic.Int64
}

func (r *recorder) Publish(_ context.Context, batch []*event.Event) error {
	for _, ev := range batch {
		var body struct {
			Aggregate string
			Step      int
		}
		d := verify.Delivery{MessageID: ev.ID, AggregateID: ev.AggregateID}
		if err := json.Unmarshal(ev.Payload, &body); err != nil {
			d.Problem = err.Error()
		}
		d.Step = body.Step
		r.log.Delivered(d)
	}
	r.n.Add(int64(len(batch)))
	return nil
}

func (r *recorder) Close() error { return nil }

// publisher is the sink a test pipeline publishes to (the methods of
// sink.Sink, which capture packages do not import).
type publisher interface {
	Publish(ctx context.Context, batch []*event.Event) error
	Close() error
}

// run runs a pipeline from src to snk until stop is called; stop waits for
// the pipeline to drain and return.
func run(t testing.TB, src capture.Source, snk publisher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := pipeline.New(src, snk, pipeline.Options{Logger: discard(), ShutdownTimeout: 10 * time.Second,
		Retry: pipeline.Retry{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("pipeline: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

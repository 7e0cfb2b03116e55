package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/pipeline"
)

// parkSink acknowledges every event but the poison one until it is
// repaired, and records the first acknowledgement of each event of the
// watched aggregate in order. It takes one event per Publish (the
// pipeline's BatchSize 1), so the poison's error is its alone.
type parkSink struct {
	watch string
	mu    sync.Mutex
	bad   string // the poison event's id; "" once repaired
	acked []string
	seen  map[string]bool
}

func (s *parkSink) Publish(_ context.Context, batch []*event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range batch {
		if ev.ID == s.bad {
			return fault.AsPermanent(errors.New("poison"))
		}
		if ev.AggregateID == s.watch && !s.seen[ev.ID] {
			s.seen[ev.ID] = true
			s.acked = append(s.acked, ev.ID)
		}
	}
	return nil
}

func (s *parkSink) Close() error { return nil }

func (s *parkSink) repair() {
	s.mu.Lock()
	s.bad = ""
	s.mu.Unlock()
}

func (s *parkSink) ackedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acked)
}

// TestParkAggregateRedriveUnderLoad, with poll capture on a real database,
// parks aggregate p behind its
// dead-lettered second event (dead_letter.park_aggregate), then redrives or
// drops the dead letter while the relay is busy with other aggregates and
// writes a newer event of p behind more load. Every event of p must be
// published in order and none left behind: the redriven (or re-sequenced)
// events come before the newer one although the relay noticed the park
// only when they came.
func TestParkAggregateRedriveUnderLoad(t *testing.T) {
	for _, action := range []string{"redrive", "drop"} {
		t.Run(action, func(t *testing.T) {
			ctx := context.Background()
			pool := outboxtest.DB(t, layout, nil)
			src, err := poll.New(ctx, poll.Options{Pool: pool, Layout: table.Layout(layout), BatchSize: 50,
				Interval: 20 * time.Millisecond, ParkAggregates: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			p := make([]string, 6)
			for i := 1; i <= 4; i++ {
				p[i] = insert(t, pool, "p", i)
			}
			snk := &parkSink{watch: "p", bad: p[2], seen: map[string]bool{}}
			pl := pipeline.New(src, snk, pipeline.Options{ParkAggregate: true, Logger: quiet, BatchSize: 1,
				Retry: pipeline.Retry{Initial: time.Millisecond, Max: 10 * time.Millisecond, MaxAttempts: 3}})
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- pl.Run(runCtx) }()
			defer func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("Run = %v", err)
				}
			}()
			waitUntil(t, "p2 dead-lettered and p3, p4 parked", func() bool {
				return count(t, pool, "outbox_dead_letter") == 1 && count(t, pool, "outbox") == 2 && len(snk.ackedIDs()) == 1
			})
			snk.repair()
			load(t, pool, 2000)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			f := schema.DeadLetterFilter{Aggregate: "p"}
			want := []string{p[1], p[2], p[3], p[4]}
			if action == "redrive" {
				_, _, err = layout.Redrive(ctx, tx, f, true)
			} else {
				_, err = layout.DropDeadLetters(ctx, tx, f, true)
				want = []string{p[1], p[3], p[4]}
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			load(t, pool, 1000)
			p[5] = insert(t, pool, "p", 5)
			want = append(want, p[5])
			waitUntil(t, "every event of p published", func() bool { return len(snk.ackedIDs()) >= len(want) })
			if got := snk.ackedIDs(); !slices.Equal(got, want) {
				t.Fatalf("p published in the order %v, want %v", got, want)
			}
			waitUntil(t, "the outbox to drain", func() bool { return count(t, pool, "outbox") == 0 })
		})
	}
}

var quiet = slog.New(slog.DiscardHandler)

// load writes n events of other aggregates in one transaction.
func load(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'load-' || (i % 97), 'step', '{}' FROM generate_series(1, $1) i`, n)
}

// waitUntil waits up to a minute for cond.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestMain(m *testing.M) { testenv.Main(m) }

var layout = outboxtest.Layout()

var mustExec = outboxtest.Exec

// insert writes event step of aggregate agg and returns its id.
func insert(t *testing.T, q schema.Querier, agg string, step int) string {
	t.Helper()
	id := uuid.NewString()
	mustExec(t, q, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', $2, 'step', $3)`,
		id, agg, fmt.Sprintf(`{"step": %d}`, step))
	return id
}

func count(t *testing.T, q schema.Querier, table string) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

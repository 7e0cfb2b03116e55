package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
)

// routeSink sends every event to one destination, "route", which answers
// like a webhook: unreachable while down is set, 400 for the poison event,
// and an acknowledgement otherwise. It records the steps of each
// aggregate's first acknowledgements and the requests per event id.
type routeSink struct {
	down   atomic.Bool
	poison string
	mu     sync.Mutex
	steps  map[string][]int
	seen   map[string]bool
	tries  map[string]int
}

func newRouteSink(poison string) *routeSink {
	return &routeSink{poison: poison, steps: map[string][]int{}, seen: map[string]bool{}, tries: map[string]int{}}
}

func (s *routeSink) Publish(_ context.Context, batch []*event.Event) error {
	errs := make([]error, len(batch))
	failed := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ev := range batch {
		s.tries[ev.ID]++
		switch {
		case s.down.Load():
			errs[i] = fault.AsUnavailable(errors.New("connection refused"))
		case ev.ID == s.poison && s.poison != "":
			errs[i] = fault.AsSuspect(errors.New("HTTP 400: bad request"))
		}
		if errs[i] != nil {
			failed = true
			continue
		}
		if !s.seen[ev.ID] {
			s.seen[ev.ID] = true
			var p struct{ Step int }
			if err := json.Unmarshal(ev.Payload, &p); err != nil {
				return err
			}
			s.steps[ev.AggregateID] = append(s.steps[ev.AggregateID], p.Step)
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

func (s *routeSink) Close() error { return nil }

func (s *routeSink) DestinationOf(*event.Event) string { return "route" }

func (s *routeSink) Probe(context.Context, string) error { return sink.ErrNoProbe }

// acked returns how many distinct events were acknowledged.
func (s *routeSink) acked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

func (s *routeSink) triesOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tries[id]
}

// checkOrder fails t unless every aggregate's first acknowledgements came
// in step order.
func (s *routeSink) checkOrder(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for agg, steps := range s.steps {
		for i := 1; i < len(steps); i++ {
			if steps[i] < steps[i-1] {
				t.Fatalf("aggregate %s acknowledged in the order %v", agg, steps)
			}
		}
	}
}

// runHeld runs a pipeline from a poll source on pool to snk until the test
// ends.
func runHeld(t *testing.T, pool *pgxpool.Pool, snk sink.Sink, park bool) *pipeline.Pipeline {
	t.Helper()
	ctx := context.Background()
	src, err := poll.New(ctx, poll.Options{Pool: pool, Layout: table.Layout(layout), BatchSize: 50,
		Interval: 20 * time.Millisecond, ParkAggregates: park, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	pl := pipeline.New(src, snk, pipeline.Options{ParkAggregate: park, Logger: quiet, BatchSize: 20,
		Retry: pipeline.Retry{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond, MaxAttempts: 3}})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pl.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return pl
}

// TestProbesRotatePastPoison: the first event a fresh relay sends to a
// destination is answered 400 (its own fault, which a never-reached
// destination cannot tell from a broken one), and 50 good events of other
// aggregates follow to the same destination. The destination is held, and
// its probes must rotate through the held aggregates: a good one reopens
// it, the 50 are published and the poison is dead-lettered as the event's
// fault. Before, the poison was the only probe, sent again and again, and
// nothing to the destination was ever delivered.
func TestProbesRotatePastPoison(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park_aggregate=%v", park), func(t *testing.T) {
			pool := outboxtest.DB(t, layout, nil)
			snk := newRouteSink("")
			runHeld(t, pool, snk, park)
			snk.mu.Lock()
			snk.poison = insert(t, pool, "bad", 1)
			poison := snk.poison
			snk.mu.Unlock()
			waitUntil(t, "the poison sent", func() bool { return snk.triesOf(poison) > 0 })
			for i := range 50 {
				insert(t, pool, fmt.Sprintf("good-%d", i), 1)
			}
			// Until the good events are in, the poison is the only held
			// aggregate and rightly the only probe: count from here.
			before := snk.triesOf(poison)
			waitUntil(t, "the 50 good events published and the poison dead-lettered", func() bool {
				return snk.acked() == 50 && count(t, pool, "outbox_dead_letter") == 1 && count(t, pool, "outbox") == 0
			})
			if n := snk.triesOf(poison) - before; n > 10 {
				t.Errorf("the poison event was sent %d more times once other aggregates were held", n)
			}
		})
	}
}

// TestReleaseCapturesOnce: 2,000 events of 100 aggregates are held in the
// outbox while their destination is down; once it is back every event is
// published, in per-aggregate order, and the release captures each held
// row a bounded number of times: at most 1.5 captures per event over the
// whole run. Before, the parks left the released rows again and again
// (tens of captures per event).
func TestReleaseCapturesOnce(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprintf("park_aggregate=%v", park), func(t *testing.T) {
			pool := outboxtest.DB(t, layout, nil)
			snk := newRouteSink("")
			snk.down.Store(true)
			pl := runHeld(t, pool, snk, park)
			const events, aggs = 2000, 100
			for step := 1; step <= events/aggs; step++ {
				mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
					SELECT gen_random_uuid(), 'order', 'agg-' || i, 'step', jsonb_build_object('step', $1::int)
					FROM generate_series(1, $2) i`, step, aggs)
			}
			waitUntil(t, "the aggregates held", func() bool { return pl.Stats().HeldAggregates.Load() == aggs })
			time.Sleep(500 * time.Millisecond)
			snk.down.Store(false)
			waitUntil(t, "every event published", func() bool { return snk.acked() == events && count(t, pool, "outbox") == 0 })
			snk.checkOrder(t)
			if c := pl.Stats().Captured.Load(); float64(c) > 1.5*events {
				t.Fatalf("%d captures for %d events: %.2f per event, want at most 1.5", c, events, float64(c)/events)
			}
			t.Logf("%d captures for %d events", pl.Stats().Captured.Load(), events)
		})
	}
}

// TestReleaseCyclesCaptureOnce: five times, the destination goes down, six
// events of six aggregates are held in the outbox, and it comes back. Each
// release must capture the held rows a bounded number of times: at most
// 1.5 captures per held event from the release until they are published
// (before: the parks left the released rows again and again while the
// claims raced the completions, 426 captures for 30 events).
func TestReleaseCyclesCaptureOnce(t *testing.T) {
	pool := outboxtest.DB(t, layout, nil)
	snk := newRouteSink("")
	pl := runHeld(t, pool, snk, false)
	const cycles, aggs = 5, 6
	var released int64
	for c := 1; c <= cycles; c++ {
		snk.down.Store(true)
		mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), 'order', 'agg-' || i, 'step', jsonb_build_object('step', $1::int)
			FROM generate_series(1, $2) i`, c, aggs)
		waitUntil(t, "the aggregates held", func() bool { return pl.Stats().HeldAggregates.Load() == aggs })
		time.Sleep(300 * time.Millisecond)
		before := pl.Stats().Captured.Load()
		snk.down.Store(false)
		waitUntil(t, "the held events published", func() bool { return snk.acked() == c*aggs && count(t, pool, "outbox") == 0 })
		time.Sleep(300 * time.Millisecond)
		released += pl.Stats().Captured.Load() - before
	}
	snk.checkOrder(t)
	if float64(released) > 1.5*cycles*aggs {
		t.Fatalf("the releases captured %d times for %d held events", released, cycles*aggs)
	}
	t.Logf("the releases captured %d times for %d held events", released, cycles*aggs)
}

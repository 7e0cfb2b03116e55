package pipeline

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/outboxrelay/relay/capture"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// TestParkAggregateLeavesLaterEvents dead-letters p1 with ParkAggregate:
// p2, of the same aggregate, is left in the outbox (neither published nor
// dead), while q1 of another aggregate is published.
func TestParkAggregateLeavesLaterEvents(t *testing.T) {
	evs := []*event.Event{mkEvent("p1", "P"), mkEvent("p2", "P"), mkEvent("q1", "Q")}
	snk := newFakeSink(func(e *event.Event, n int) action {
		if e.ID == "p1" {
			return action{err: fault.AsPermanent(errors.New("too large"))}
		}
		return action{}
	})
	opts := testOptions()
	opts.ParkAggregate = true
	r := start(t, newFakeSource(evs), snk, opts)
	waitFor(t, "the batch to complete", 5*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	completes, _, _ := r.src.handedBatches()[0].state()
	o := completes[0]
	if len(o.Dead) != 1 || o.Dead[0].Event.ID != "p1" {
		t.Fatalf("dead = %v, want p1", o.Dead)
	}
	if len(o.Published) != 1 || o.Published[0].ID != "q1" {
		t.Fatalf("published = %v, want only q1 (p2 stays parked)", o.Published)
	}
	if snk.attemptsOf("p2") != 0 {
		t.Fatal("p2 was published while its aggregate was parked")
	}
}

// streamSource hands out the batches sent on its channel and keeps no
// reference to them; it counts completions.
type streamSource struct {
	next      chan []*event.Event
	completed atomic.Int64
}

type streamBatch struct {
	src *streamSource
	evs []*event.Event
}

func (s *streamSource) Next(ctx context.Context) (capture.Batch, error) {
	select {
	case evs := <-s.next:
		return &streamBatch{src: s, evs: evs}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *streamSource) Close() error { return nil }

func (b *streamBatch) Events() []*event.Event { return b.evs }

func (b *streamBatch) Complete(context.Context, capture.Outcome) error {
	b.src.completed.Add(1)
	return nil
}

func (b *streamBatch) Abandon(context.Context) {}

// TestParkKeepsNoBatch dead-letters p1 with ParkAggregate and then hands
// over batches of other aggregates only: once batches captured after the
// dead letter's commit arrive, nothing of p1's batch may stay reachable
// (the park keeps the aggregate's key, not the batch), although aggregate P
// never shows up again.
func TestParkKeepsNoBatch(t *testing.T) {
	src := &streamSource{next: make(chan []*event.Event)}
	snk := newFakeSink(func(e *event.Event, n int) action {
		if e.AggregateID == "P" {
			return action{err: fault.AsPermanent(errors.New("too large"))}
		}
		return action{}
	})
	opts := testOptions()
	opts.ParkAggregate = true
	p := New(src, snk, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	dead := func() weak.Pointer[event.Event] {
		p1, p2 := mkEvent("p1", "P"), mkEvent("p2", "P")
		p1.Payload = make([]byte, 1<<20)
		src.next <- []*event.Event{p1, p2}
		return weak.Make(p1)
	}()
	waitFor(t, "the dead letter's batch to complete", 5*time.Second, func() bool { return src.completed.Load() == 1 })
	for i := range 3 {
		src.next <- []*event.Event{mkEvent(fmt.Sprint("q", i), "Q")}
	}
	waitFor(t, "p1 to be collected", 10*time.Second, func() bool {
		runtime.GC()
		return dead.Value() == nil
	})
}

package pipeline

import (
	"errors"
	"testing"
	"time"

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

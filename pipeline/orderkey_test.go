package pipeline

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
)

// TestOrderKeyOneInFlight gives events of 300 aggregates 7 order keys
// (outbox.order_by): events of one key, whatever their aggregate, are
// never in flight together and are published in source order.
func TestOrderKeyOneInFlight(t *testing.T) {
	batches := randomBatches(rand.New(rand.NewPCG(3, 4)), 2000, 300, 40)
	for _, b := range batches {
		for _, e := range b {
			e.OrderKey = fmt.Sprintf("tenant-%d", hashOf(e.AggregateID)%7)
		}
	}
	src := newFakeSource(batches...)
	snk := newFakeSink(func(e *event.Event, _ int) action {
		return action{delay: time.Duration(hashOf(e.ID)%1500) * time.Microsecond}
	})
	opts := testOptions()
	opts.Concurrency = 8
	opts.BatchSize = 50
	r := start(t, src, snk, opts)
	waitFor(t, "every batch to complete", 30*time.Second, func() bool { return src.countCompleted() == len(batches) })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, src, snk)
}

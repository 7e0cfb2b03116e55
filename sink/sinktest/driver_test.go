package sinktest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
)

// TestDriverEmpty checks that driving an empty source with a window of 0
// returns at once: the cancel/during check does so when every event of the
// cancelled batch was acknowledged before the cancellation took effect.
func TestDriverEmpty(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := newDriver(nil, 4, 100)
	for _, window := range []int{0, 1, 10} {
		if err := d.run(ctx, sliceSource([]*event.Event{}), window); err != nil {
			t.Fatalf("window %d: run on an empty source: %v", window, err)
		}
	}
}

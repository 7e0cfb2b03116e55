package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// holdingSource is a fakeSource that is a capture.Holder.
type holdingSource struct {
	*fakeSource
	held map[string]bool
}

func (s *holdingSource) Hold(key string) { s.held[key] = true }

func (s *holdingSource) Release(keys []string) uint64 {
	for _, k := range keys {
		delete(s.held, k)
	}
	return 1
}

// aggregateRoutes publishes each aggregate to a destination of its own,
// and every destination is unreachable.
type aggregateRoutes struct{}

func (aggregateRoutes) Publish(context.Context, []*event.Event) error {
	return fault.AsUnavailable(errors.New("connection refused"))
}
func (aggregateRoutes) Close() error                        { return nil }
func (aggregateRoutes) DestinationOf(e *event.Event) string { return "route-" + e.AggregateID }
func (aggregateRoutes) Probe(context.Context, string) error { return errors.New("connection refused") }

// TestProbeCopiesBounded: 300 aggregates of 64 KiB events, each to a
// destination of its own, all unreachable. The copies of held events kept
// as probes stay within maxProbeBytes (before: one per destination, 300
// payloads outside the window), the aggregates beyond are held in memory,
// within the window, and every destination still has a probe.
func TestProbeCopiesBounded(t *testing.T) {
	src := &holdingSource{fakeSource: newFakeSource(), held: map[string]bool{}}
	opts := testOptions()
	opts.MaxInFlightBytes = 4 << 20
	p := New(src, aggregateRoutes{}, opts)
	e := newEngine(p, context.Background())
	payload := []byte(`"` + strings.Repeat("x", 64<<10) + `"`)
	const aggs = 300
	for i := range aggs {
		ev := mkEvent(fmt.Sprintf("e%d", i), fmt.Sprintf("a%d", i))
		ev.Payload = payload
		e.add(captured{batch: src.newBatch([]*event.Event{ev})})
		e.dispatch()
		for e.inFlight > 0 {
			e.settle(<-e.results)
			e.dispatch()
		}
	}
	if e.probeBytes > e.maxProbeBytes() {
		t.Fatalf("probe copies hold %d bytes, more than %d", e.probeBytes, e.maxProbeBytes())
	}
	copies, inMemory := 0, 0
	for _, d := range e.dests {
		if !d.open {
			t.Fatalf("destination %s not broken", d.name)
		}
		copies += d.probes
		if len(d.waiting) == 0 {
			t.Fatalf("destination %s has no probe", d.name)
		}
	}
	inMemory = e.held
	if copies == 0 || copies+inMemory != aggs {
		t.Fatalf("%d probe copies and %d events held in memory for %d aggregates", copies, inMemory, aggs)
	}
	if len(src.held) != copies {
		t.Fatalf("%d aggregates held in the source, want the %d with copies", len(src.held), copies)
	}
}

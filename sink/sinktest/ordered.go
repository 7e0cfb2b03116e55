package sinktest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// Sizes of the ordered/runs subtest: events of few aggregates, published
// in runs of at most orderedRun events of one aggregate per call.
const (
	orderedEvents     = 3000
	orderedAggregates = 12
	orderedRun        = 50
)

// testOrdered checks a sink that implements sink.Ordered; for any other
// sink there is nothing to check.
func (s *suite) testOrdered(t *testing.T) {
	tg := s.newTarget(t, "run", "{aggregate_type}")
	o, ok := tg.snk.(sink.Ordered)
	if !ok || o.MaxPerAggregate() < 2 {
		t.Log("the sink does not implement sink.Ordered: one event of an aggregate per publish")
		return
	}
	per := min(o.MaxPerAggregate(), orderedRun)
	s.run(t, "runs", func(t *testing.T) {
		events := spreadEvents(orderedEvents, orderedAggregates)
		if err := driveRuns(t, tg.snk, events, per); err != nil {
			t.Fatal(err)
		}
		msgs := s.await(t, tg.scope, events)
		s.checkDelivered(t, tg, events, msgs, expect{})
		s.checkOrder(t, events, msgs)
	})
	s.run(t, "oversize", func(t *testing.T) {
		if s.h.MaxMessageBytes <= 0 {
			t.Log("Harness.MaxMessageBytes is 0: no oversized event to send")
			return
		}
		tg := s.newTarget(t, "runbig", "{aggregate_type}")
		events := make([]*event.Event, 6)
		for i := range events {
			events[i] = newEvent("order", "o-1", fmt.Sprint("step-", i))
		}
		big := events[3]
		big.Payload = bytes.Repeat([]byte("x"), s.h.MaxMessageBytes+1)
		big.ContentType = event.ContentTypeText
		if err := driveRuns(t, tg.snk, events, per); err != nil {
			t.Fatal(err)
		}
		want := append(events[:3:3], events[4:]...)
		msgs := s.await(t, tg.scope, want)
		s.checkDelivered(t, tg, want, msgs, expect{})
		s.checkOrder(t, want, msgs)
		for id, copies := range s.byID(msgs) {
			if len(copies) > 1 {
				t.Errorf("event %s arrived %d times: an event after the oversized one was stored while it failed", id, len(copies))
			}
		}
	})
}

// driveRuns publishes events the way the pipeline does with a
// sink.Ordered sink: each call carries, for every aggregate with events
// left, up to per of its next events in order; the events of an aggregate
// count as published up to its first failure in the call, and the rest are
// sent again after it. It fails t when an event is reported acknowledged
// after an earlier event of its aggregate in the same call failed, and
// drops an event that fails as permanent, as the pipeline dead-letters it.
func driveRuns(t *testing.T, snk sink.Sink, events []*event.Event, per int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), driveGuard)
	defer cancel()
	queues := map[string][]*event.Event{}
	var aggs []string
	for _, e := range events {
		if queues[e.Key()] == nil {
			aggs = append(aggs, e.Key())
		}
		queues[e.Key()] = append(queues[e.Key()], e)
	}
	r := &reporter{t: t}
	for attempt := 0; ; attempt++ {
		var batch []*event.Event
		for _, a := range aggs {
			batch = append(batch, queues[a][:min(per, len(queues[a]))]...)
		}
		if len(batch) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%d events not acknowledged: %w", len(batch), ctx.Err())
		}
		err := snk.Publish(ctx, batch)
		failed := map[string]bool{}
		for i, e := range batch {
			f := sink.Failed(err, i)
			switch {
			case failed[e.Key()]:
				if f == nil {
					r.errorf("event %s of aggregate %s acknowledged after an earlier event of it in the same call failed", e.ID, e.Key())
				}
			case f == nil:
				queues[e.Key()] = queues[e.Key()][1:]
			case fault.ClassOf(f) == fault.Permanent:
				t.Logf("event %s failed as permanent, dropped as the pipeline dead-letters it: %v", e.ID, f)
				queues[e.Key()] = queues[e.Key()][1:]
				failed[e.Key()] = true
			default:
				failed[e.Key()] = true
			}
		}
		if len(failed) > 0 {
			time.Sleep(min(10*time.Millisecond<<min(attempt, 5), 250*time.Millisecond))
		}
	}
}

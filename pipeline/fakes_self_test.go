package pipeline

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// The fakes' checks must be able to fail, or the tests prove nothing.

func TestFakeSinkFlagsOverlappingAggregate(t *testing.T) {
	snk := newFakeSink(func(*event.Event, int) action { return action{delay: 20 * time.Millisecond} })
	var wg sync.WaitGroup
	for _, id := range []string{"a1", "a2"} {
		wg.Go(func() { _ = snk.Publish(context.Background(), []*event.Event{mkEvent(id, "A")}) })
	}
	wg.Wait()
	_ = snk.Publish(context.Background(), []*event.Event{mkEvent("b1", "B"), mkEvent("b2", "B")})
	got := strings.Join(snk.violations, "\n")
	if !strings.Contains(got, "is in flight") || !strings.Contains(got, "twice in one Publish call") {
		t.Errorf("violations = %q, want both an overlap and a duplicate in one call", got)
	}
}

func TestFakeSinkBatchErrors(t *testing.T) {
	errDown := fault.AsUnavailable(errors.New("down"))
	snk := newFakeSink(func(e *event.Event, _ int) action {
		switch e.ID[0] {
		case 'f':
			return action{err: errFlaky}
		case 'd':
			return action{err: errDown}
		}
		return action{}
	})
	pub := func(ids ...string) error {
		var evs []*event.Event
		for _, id := range ids {
			evs = append(evs, mkEvent(id, "agg-"+id))
		}
		return snk.Publish(context.Background(), evs)
	}
	if err := pub("ok1", "ok2"); err != nil {
		t.Errorf("all ok: %v", err)
	}
	if err := pub("f1"); err != errFlaky {
		t.Errorf("single failure: %v", err)
	}
	if err := pub("d1", "d2"); err != errDown {
		t.Errorf("whole batch down: %v, want the plain error", err)
	}
	err := pub("ok3", "f2")
	var be *sink.BatchError
	if !errors.As(err, &be) || sink.Failed(err, 0) != nil || sink.Failed(err, 1) != errFlaky {
		t.Errorf("partial failure: %v, want a BatchError", err)
	}
}

func TestOrderProblemsDetected(t *testing.T) {
	src := newFakeSource([]*event.Event{mkEvent("a1", "A"), mkEvent("a2", "A"), mkEvent("a3", "A")})
	if _, err := src.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]attemptRec{
		"overtaken":         {{id: "a1", err: errFlaky}, {id: "a2"}},
		"skipped":           {{id: "a1"}, {id: "a3"}},
		"backwards":         {{id: "a1"}, {id: "a2"}, {id: "a1"}},
		"not first":         {{id: "a2"}},
		"published twice":   {{id: "a1"}, {id: "a1"}},
		"unknown event":     {{id: "zz"}},
		"ok (retry + dead)": {{id: "a1", err: errFlaky}, {id: "a1"}, {id: "a2", err: errFlaky}, {id: "a3"}},
	}
	dead := map[string]capture.DeadEvent{"a2": {}}
	for name, recs := range cases {
		snk := newFakeSink(nil)
		snk.perAgg["A"] = recs
		got := orderProblems(src, snk, dead)
		if want := strings.HasPrefix(name, "ok"); want != (len(got) == 0) {
			t.Errorf("%s: problems %q", name, got)
		}
	}
}

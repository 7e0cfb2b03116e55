package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// partitionSink is a fake sink.Ordered sink that behaves like one Kafka
// partition per aggregate behind an idempotent producer: it stores a
// batch's events in batch order, and once an event of an aggregate fails,
// every later event of that aggregate in the batch fails with the same
// error and is not stored.
type partitionSink struct {
	perAgg int
	script func(e *event.Event, attempt int) error

	mu         sync.Mutex
	attempts   map[string]int
	stored     map[string][]string // aggregate -> stored event IDs, in order
	inFlight   map[string]bool
	calls      int
	longestRun int // most events of one aggregate in one call
	violations []string
}

func newPartitionSink(perAgg int, script func(e *event.Event, attempt int) error) *partitionSink {
	return &partitionSink{perAgg: perAgg, script: script, attempts: map[string]int{},
		stored: map[string][]string{}, inFlight: map[string]bool{}}
}

func (s *partitionSink) MaxPerAggregate() int { return s.perAgg }
func (s *partitionSink) Close() error         { return nil }

func (s *partitionSink) Publish(_ context.Context, batch []*event.Event) error {
	s.mu.Lock()
	s.calls++
	run := map[string][]*event.Event{}
	for _, e := range batch {
		run[e.Key()] = append(run[e.Key()], e)
	}
	for agg, evs := range run {
		if s.inFlight[agg] {
			s.violations = append(s.violations, "two calls in flight for "+agg)
		}
		s.inFlight[agg] = true
		s.longestRun = max(s.longestRun, len(evs))
		if len(evs) > s.perAgg {
			s.violations = append(s.violations, fmt.Sprintf("%d events of %s in one call, more than %d", len(evs), agg, s.perAgg))
		}
		if !slices.IsSortedFunc(evs, func(a, b *event.Event) int { return int(a.Position) - int(b.Position) }) {
			s.violations = append(s.violations, "events of "+agg+" out of order in a batch")
		}
	}
	s.mu.Unlock()
	time.Sleep(time.Millisecond) // a broker round trip

	s.mu.Lock()
	defer s.mu.Unlock()
	errs := make([]error, len(batch))
	failed := map[string]error{}
	for i, e := range batch {
		s.attempts[e.ID]++
		if err, ok := failed[e.Key()]; ok {
			errs[i] = err
			continue
		}
		if err := s.script(e, s.attempts[e.ID]); err != nil {
			errs[i], failed[e.Key()] = err, err
			continue
		}
		s.stored[e.Key()] = append(s.stored[e.Key()], e.ID)
	}
	for agg := range run {
		delete(s.inFlight, agg)
	}
	return combine(errs)
}

// TestOrderedSinkRuns publishes hot aggregates through a sink.Ordered sink
// that fails an event mid-run and, like Kafka's idempotent producer, every
// later event of the aggregate in the call with the same error: the later
// events are published again after the failed one without counting an
// attempt, so a permanent error dead-letters only the event it belongs to,
// and each aggregate's stored events are its events in source order.
func TestOrderedSinkRuns(t *testing.T) {
	const aggs, perAgg = 4, 400
	poison, flaky := "a0-100", "a1-75"
	snk := newPartitionSink(64, func(e *event.Event, attempt int) error {
		switch {
		case e.ID == poison:
			return fault.AsPermanent(fmt.Errorf("INVALID_RECORD for the batch holding %s", e.ID))
		case e.ID == flaky && attempt <= 2:
			return fmt.Errorf("CORRUPT_MESSAGE for the batch holding %s", e.ID)
		}
		return nil
	})
	var batches [][]*event.Event
	for i := 0; i < perAgg; i += 50 {
		var b []*event.Event
		for j := i; j < i+50; j++ {
			for a := range aggs {
				b = append(b, mkEvent(fmt.Sprintf("a%d-%d", a, j), fmt.Sprintf("a%d", a)))
			}
		}
		batches = append(batches, b)
	}
	src := newFakeSource(batches...)
	opts := testOptions()
	opts.Retry.MaxAttempts = 3
	r := start(t, src, snk, opts)
	waitFor(t, "every batch settled", 30*time.Second, func() bool { return src.settled.Load() == int64(len(batches)) })
	if err := r.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	dead := src.checkSettledOnce(t)
	if len(dead) != 1 || dead[poison].Event == nil {
		t.Errorf("dead letters %v, want only %s", keys(dead), poison)
	}
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for _, v := range snk.violations {
		t.Error(v)
	}
	for a := range aggs {
		agg := fmt.Sprintf("a%d", a)
		var want []string
		for j := range perAgg {
			if id := fmt.Sprintf("a%d-%d", a, j); id != poison {
				want = append(want, id)
			}
		}
		if got := snk.stored[agg]; !slices.Equal(got, want) {
			t.Errorf("%s: stored %d events, want %d in source order; first difference at %d", agg, len(got), len(want), firstDiff(got, want))
		}
	}
	if snk.attempts[flaky] != 3 {
		t.Errorf("%s attempted %d times, want 3", flaky, snk.attempts[flaky])
	}
	if snk.longestRun < 2 {
		t.Errorf("at most %d events of an aggregate in one call: not pipelined", snk.longestRun)
	}
	t.Logf("%d calls for %d events, up to %d of one aggregate in a call", snk.calls, aggs*perAgg, snk.longestRun)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

var _ sink.Ordered = (*partitionSink)(nil)

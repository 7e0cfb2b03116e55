package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// routedSink is a fakeSink whose destination is the event's aggregate type,
// with a scripted Probe.
type routedSink struct {
	*fakeSink
	probeErr atomic.Pointer[error] // nil: probes pass
	probes   atomic.Int64
}

func (s *routedSink) DestinationOf(e *event.Event) string { return "dest-" + e.AggregateType }

func (s *routedSink) Probe(_ context.Context, dest string) error {
	s.probes.Add(1)
	if p := s.probeErr.Load(); p != nil {
		return *p
	}
	return nil
}

// destEvents makes n events per destination type, spread over aggs
// aggregates of each.
func destEvents(types []string, n, aggs int) []*event.Event {
	var evs []*event.Event
	for i := range n {
		for _, typ := range types {
			e := mkEvent(fmt.Sprintf("%s-%03d", typ, i), fmt.Sprintf("%s-agg-%d", typ, i%aggs))
			e.AggregateType = typ
			evs = append(evs, e)
		}
	}
	return evs
}

// window fails events to destination type typ with err, once after
// attempts to typ went through, until it is closed.
type window struct {
	typ   string
	err   error
	after int64
	seen  atomic.Int64
	open  atomic.Bool
}

func (w *window) script(next func(e *event.Event, n int) action) func(e *event.Event, n int) action {
	return func(e *event.Event, n int) action {
		if e.AggregateType == w.typ && w.seen.Add(1) > w.after && w.open.Load() {
			return action{err: w.err}
		}
		if next != nil {
			return next(e, n)
		}
		return action{}
	}
}

// The pipeline's side of a destination refusing every event for a while
// (401, 403, 404, a missing topic, a 400 for every event): with
// max_attempts 1, nothing is dead-lettered, nothing is reordered, the
// other destination keeps flowing, readiness names the broken destination
// while it lasts, and everything is delivered once it works again. The
// errors are classified as the sinks classify those answers.
func TestBrokenDestinationHeldNotDeadLettered(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"unavailable", fault.AsUnavailable(errors.New("401 Unauthorized"))},
		{"suspect-permanent", fault.AsSuspect(fault.AsPermanent(errors.New("400 Bad Request")))},
		{"suspect-transient", fault.AsSuspect(errors.New("500 Internal Server Error"))},
	} {
		for _, after := range []int64{0, 50} {
			t.Run(fmt.Sprintf("%s/after-%d", tc.name, after), func(t *testing.T) {
				brokenDestination(t, tc.err, after)
			})
		}
	}
}

// brokenDestination runs one case of TestBrokenDestinationHeldNotDeadLettered:
// destination a fails with err after its first after attempts. A
// destination that acknowledged events before may see the failed events of
// the call that also had some acknowledged, then suspectStreak-1 lone
// events, dead-lettered before it counts as broken.
func brokenDestination(t *testing.T, failure error, after int64) {
	w := &window{typ: "a", err: failure, after: after}
	w.open.Store(true)
	snk := &routedSink{fakeSink: newFakeSink(w.script(nil))}
	opts := testOptions()
	opts.BatchSize = 8
	opts.Concurrency = 1 // one Publish call spans the moment a starts failing
	opts.Retry = Retry{Initial: time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 1}
	evs := destEvents([]string{"a", "b"}, 200, 20)
	r := start(t, newFakeSource(evs[:200], evs[200:]), snk, opts)

	waitFor(t, "destination a to be reported broken", 5*time.Second, func() bool {
		l := r.p.Destinations()
		return !r.p.Stats().Ready.Load() && len(l) == 1 && l[0].Name == "dest-a"
	})
	waitFor(t, "destination b's events to go through", 10*time.Second, func() bool {
		return snk.ackedCount("") >= 200+int(after)
	})
	probed := w.seen.Load()
	waitFor(t, "a few probes of destination a", 10*time.Second, func() bool { return w.seen.Load() >= probed+3 })
	w.open.Store(false)
	waitFor(t, "both batches to complete", 10*time.Second, func() bool { return r.src.countCompleted() == 2 })
	if !r.p.Stats().Ready.Load() || len(r.p.Destinations()) != 0 {
		t.Errorf("still not ready after the destination recovered: %v", r.p.Destinations())
	}
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dead := r.src.checkSettledOnce(t)
	snk.checkViolations(t)
	checkOrder(t, r.src, snk.fakeSink, dead)
	allowed := 0
	if after > 0 && fault.IsSuspect(failure) {
		// The call that spans the switch has events of a acknowledged, so
		// its failures are the events' own; then a streak counts.
		allowed = opts.BatchSize + suspectStreak - 1
	}
	if len(dead) > allowed {
		t.Fatalf("%d events dead-lettered while their destination was broken, want ≤ %d", len(dead), allowed)
	}
	for _, b := range r.src.handedBatches() {
		for _, e := range b.events {
			if _, isDead := dead[e.ID]; !isDead && !snk.isAcked(e.ID) {
				t.Errorf("event %s never acknowledged", e.ID)
			}
		}
	}
	t.Logf("%d dead, %d Publish calls", len(dead), len(snk.callList()))
}

// A poison event (a 400 for it alone) is dead-lettered at once and its
// neighbours on the same destination go on, even as the first event the
// destination ever saw; one failing with a suspect 500 is dead-lettered
// after max_attempts.
func TestPoisonEventDeadLetteredBesideHealthyNeighbours(t *testing.T) {
	evs := destEvents([]string{"a"}, 60, 6)
	poison := map[string]error{
		evs[0].ID:  fault.AsSuspect(fault.AsPermanent(errors.New("400 Bad Request"))),
		evs[31].ID: fault.AsSuspect(errors.New("500 Internal Server Error")),
	}
	snk := &routedSink{fakeSink: newFakeSink(func(e *event.Event, n int) action {
		return action{err: poison[e.ID]}
	})}
	opts := testOptions()
	opts.BatchSize = 1 // the poison is alone in its first Publish call
	opts.Retry = Retry{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxAttempts: 3}
	r := start(t, newFakeSource(evs), snk, opts)
	waitFor(t, "the batch to complete", 10*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dead := r.src.checkSettledOnce(t)
	checkOrder(t, r.src, snk.fakeSink, dead)
	if len(dead) != 2 {
		t.Fatalf("dead = %v, want the two poison events", dead)
	}
	if d := dead[evs[0].ID]; d.Attempts != 1 || d.Class != "permanent" {
		t.Errorf("400 poison: attempts %d class %s, want 1 permanent", d.Attempts, d.Class)
	}
	if d := dead[evs[31].ID]; d.Attempts != 3 || d.Class != "transient" {
		t.Errorf("500 poison: attempts %d class %s, want 3 transient", d.Attempts, d.Class)
	}
	if n := snk.ackedCount(""); n != 58 {
		t.Errorf("%d neighbours acknowledged, want 58", n)
	}
}

// With an idle outbox, a failing sink probe makes the relay not ready,
// and a passing one ready again.
func TestIdleProbeReportsBrokenBroker(t *testing.T) {
	snk := &routedSink{fakeSink: newFakeSink(nil)}
	down := error(fault.AsUnavailable(errors.New("connection refused")))
	snk.probeErr.Store(&down)
	opts := testOptions()
	opts.ProbeInterval = 20 * time.Millisecond
	r := start(t, newFakeSource(), snk, opts)
	waitFor(t, "not ready", 5*time.Second, func() bool {
		l := r.p.Destinations()
		return !r.p.Stats().Ready.Load() && len(l) == 1 && l[0].Name == sink.Broker
	})
	snk.probeErr.Store(nil)
	waitFor(t, "ready", 5*time.Second, func() bool { return r.p.Stats().Ready.Load() })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// rowRoutedSink is a routedSink whose destinations row values choose, like
// a sink with a destination template (sink.RowRouted).
type rowRoutedSink struct{ *routedSink }

func (rowRoutedSink) RowChosen() bool { return true }

// A broken destination that row values chose (a templated webhook URL
// answering 404 for one aggregate type) is reported and counted, but the
// relay stays ready while the other destinations work; once every
// destination in use is broken, it is not ready.
func TestRowChosenDestinationKeepsReady(t *testing.T) {
	bad := &window{typ: "a", err: fault.AsUnavailable(errors.New("404 Not Found"))}
	bad.open.Store(true)
	snk := rowRoutedSink{&routedSink{fakeSink: newFakeSink(bad.script(nil))}}
	opts := testOptions()
	opts.Retry = Retry{Initial: time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 1}
	evs := destEvents([]string{"a", "b"}, 100, 10)
	r := start(t, newFakeSource(evs), snk, opts)
	waitFor(t, "a broken, b's events through", 10*time.Second, func() bool {
		l := r.p.Destinations()
		return len(l) == 1 && l[0].Name == "dest-a" && snk.ackedCount("") >= 100
	})
	waitFor(t, "ready with a broken", 5*time.Second, func() bool { return r.p.Stats().SinkReady() })
	if n := r.p.Stats().Broken.Load(); n != 1 {
		t.Errorf("Broken = %d, want 1", n)
	}
	probed := bad.seen.Load()
	waitFor(t, "a few probes of a", 10*time.Second, func() bool { return bad.seen.Load() >= probed+3 })
	if !r.p.Stats().SinkReady() {
		t.Errorf("not ready while a row-chosen destination is probed: %v", r.p.Destinations())
	}
	bad.open.Store(false)
	waitFor(t, "the batch to complete", 10*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// When the only row-chosen destination in use is broken, or the broker
// probe fails, a sink with row-chosen destinations is not ready.
func TestRowChosenAllBrokenNotReady(t *testing.T) {
	bad := &window{typ: "a", err: fault.AsUnavailable(errors.New("connection refused"))}
	bad.open.Store(true)
	snk := rowRoutedSink{&routedSink{fakeSink: newFakeSink(bad.script(nil))}}
	opts := testOptions()
	opts.ProbeInterval = 20 * time.Millisecond
	opts.Retry = Retry{Initial: time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 1}
	r := start(t, newFakeSource(destEvents([]string{"a"}, 20, 4)), snk, opts)
	waitFor(t, "not ready with a broken", 5*time.Second, func() bool {
		l := r.p.Destinations()
		return !r.p.Stats().Ready.Load() && len(l) == 1 && l[0].Name == "dest-a"
	})
	down := error(fault.AsUnavailable(errors.New("connection refused")))
	snk.probeErr.Store(&down)
	bad.open.Store(false)
	waitFor(t, "the broker reported broken", 5*time.Second, func() bool {
		for _, d := range r.p.Destinations() {
			if d.Name == sink.Broker {
				return !r.p.Stats().Ready.Load()
			}
		}
		return false
	})
	snk.probeErr.Store(nil)
	waitFor(t, "ready", 10*time.Second, func() bool { return r.p.Stats().Ready.Load() })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

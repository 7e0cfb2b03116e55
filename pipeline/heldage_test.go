package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/fault"
)

// TestHeldMaxAge: destination a refuses every event (401) and its probe.
// Its events are held, not dead-lettered, until it has been broken for
// HeldMaxAge; then they are dead-lettered with the reason, the other
// destination having flowed all along. The relay stays not ready until a
// works again.
func TestHeldMaxAge(t *testing.T) {
	w := &window{typ: "a", err: fault.AsUnavailable(errors.New("401 Unauthorized"))}
	w.open.Store(true)
	snk := &routedSink{fakeSink: newFakeSink(w.script(nil))}
	probeErr := w.err
	snk.probeErr.Store(&probeErr)
	opts := testOptions()
	opts.HeldMaxAge = time.Second
	opts.ProbeInterval = 50 * time.Millisecond
	opts.Retry = Retry{Initial: time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 1}
	evs := destEvents([]string{"a", "b"}, 50, 10)
	src := newFakeSource(evs)
	r := start(t, src, snk, opts)

	waitFor(t, "destination b's events to go through", 10*time.Second, func() bool { return snk.ackedCount("") >= 50 })
	if n := r.p.Stats().DeadLettered.Load(); n != 0 {
		t.Fatalf("%d events dead-lettered before sink.held_max_age", n)
	}
	waitFor(t, "destination a's held events to be dead-lettered", 10*time.Second, func() bool {
		return r.p.Stats().DeadLettered.Load() == 50
	})
	if r.p.Stats().Ready.Load() {
		t.Error("ready while destination a is still broken")
	}
	w.open.Store(false)
	snk.probeErr.Store(nil)
	waitFor(t, "destination a to be ready", 10*time.Second, func() bool { return r.p.Stats().Ready.Load() })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	dead := r.src.checkSettledOnce(t)
	for id, d := range dead {
		if !strings.HasPrefix(id, "a-") || !strings.Contains(d.Err, "sink.held_max_age") || !strings.Contains(d.Err, "401") {
			t.Errorf("dead letter %s: %q", id, d.Err)
		}
	}
	snk.checkViolations(t)
}

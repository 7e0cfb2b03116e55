package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// randomBatches spreads n events over aggs aggregates (chosen at random) and
// cuts them into batches of 0..maxBatch events, in source order.
func randomBatches(rng *rand.Rand, n, aggs, maxBatch int) [][]*event.Event {
	var out [][]*event.Event
	for i := 0; i < n; {
		size := min(rng.IntN(maxBatch+1), n-i)
		evs := make([]*event.Event, 0, size)
		for range size {
			evs = append(evs, mkEvent(fmt.Sprintf("e%05d", i), fmt.Sprintf("agg-%03d", rng.IntN(aggs))))
			i++
		}
		out = append(out, evs)
	}
	return out
}

func countEvents(batches [][]*event.Event) int {
	n := 0
	for _, b := range batches {
		n += len(b)
	}
	return n
}

// checkAllPublished fails t unless every batch was completed with all its
// events published and none dead, and the sink acknowledged each exactly once.
func checkAllPublished(t *testing.T, src *fakeSource, snk *fakeSink) {
	t.Helper()
	dead := src.checkSettledOnce(t)
	if len(dead) > 0 {
		t.Errorf("%d events dead-lettered, want none", len(dead))
	}
	for _, b := range src.handedBatches() {
		if b.abandoned() {
			t.Errorf("batch %d abandoned, want completed", b.seq)
		}
		for _, e := range b.events {
			if !snk.isAcked(e.ID) {
				t.Errorf("event %s never acknowledged", e.ID)
			}
		}
	}
	snk.checkViolations(t)
	checkOrder(t, src, snk, dead)
}

func checkStats(t *testing.T, st *Stats, captured, published, dead, retries int64) {
	t.Helper()
	got := [...]int64{st.Captured.Load(), st.Published.Load(), st.DeadLettered.Load(), st.Retries.Load(), st.InFlight.Load()}
	want := [...]int64{captured, published, dead, retries, 0}
	if got != want {
		t.Errorf("stats captured/published/dead/retries/in-flight = %v, want %v", got, want)
	}
}

// 1. Thousands of events over hundreds of aggregates, random delays,
// concurrency 8: per-aggregate order holds and every batch completes once.
func TestPerAggregateOrderUnderConcurrency(t *testing.T) {
	batches := randomBatches(rand.New(rand.NewPCG(1, 2)), 4000, 300, 40)
	n := countEvents(batches)
	src := newFakeSource(batches...)
	snk := newFakeSink(func(e *event.Event, _ int) action {
		return action{delay: time.Duration(hashOf(e.ID)%1500) * time.Microsecond}
	})
	opts := testOptions()
	opts.Concurrency = 8
	opts.BatchSize = 50
	opts.MaxInFlight = 1000
	r := start(t, src, snk, opts)

	waitFor(t, "every batch to complete", 20*time.Second, func() bool { return src.countCompleted() == len(batches) })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, src, snk)
	checkStats(t, r.p.Stats(), int64(n), int64(n), 0, 0)
	if got := r.p.Stats().Archived.Load(); got != int64(n) {
		t.Errorf("Archived = %d, want %d", got, n)
	}
	if snk.maxCur > opts.Concurrency {
		t.Errorf("%d Publish calls in flight at once, want at most %d", snk.maxCur, opts.Concurrency)
	}
	if snk.maxBatch > opts.BatchSize {
		t.Errorf("Publish call with %d events, want at most %d", snk.maxBatch, opts.BatchSize)
	}
	t.Logf("%d events in %d batches, %d Publish calls, at most %d at once", n, len(batches), len(snk.callList()), snk.maxCur)
}

// 1b. The same with failures of every class mixed in, partly inside
// BatchErrors: order still holds, only permanent failures are dead.
func TestRandomFailuresKeepOrder(t *testing.T) {
	batches := randomBatches(rand.New(rand.NewPCG(3, 4)), 3000, 200, 80)
	n := countEvents(batches)
	errDown := fault.AsUnavailable(errors.New("connection refused"))
	flakyIDs, permIDs := map[string]bool{}, map[string]bool{}
	for _, b := range batches {
		for _, e := range b {
			switch h := hashOf(e.ID); {
			case h%100 == 2:
				permIDs[e.ID] = true
			case h%20 == 0:
				flakyIDs[e.ID] = true
			}
		}
	}
	snk := newFakeSink(func(e *event.Event, attempt int) action {
		h := hashOf(e.ID)
		a := action{delay: time.Duration(h%700) * time.Microsecond}
		switch {
		case permIDs[e.ID]:
			a.err = fault.AsPermanent(fmt.Errorf("%s: message too large", e.ID))
		case flakyIDs[e.ID] && attempt == 1:
			a.err = fmt.Errorf("%s: %w", e.ID, errFlaky)
		case h%50 == 1 && attempt <= 2:
			a.err = errDown
		}
		return a
	})
	opts := testOptions()
	opts.Concurrency = 8
	opts.BatchSize = 25
	opts.Retry = Retry{Initial: time.Millisecond, Max: 4 * time.Millisecond, MaxAttempts: 4}
	r := start(t, src(batches), snk, opts)

	waitFor(t, "every batch to complete", 20*time.Second, func() bool { return r.src.countCompleted() == len(batches) })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	dead := r.src.checkSettledOnce(t)
	snk.checkViolations(t)
	checkOrder(t, r.src, snk, dead)
	for id := range permIDs {
		d, ok := dead[id]
		switch {
		case !ok:
			t.Errorf("permanently failing %s is not dead", id)
		case d.Attempts != 1 || d.Class != "permanent" || !strings.Contains(d.Err, "message too large"):
			t.Errorf("dead %s = attempts %d class %q err %q, want 1, permanent, message too large", id, d.Attempts, d.Class, d.Err)
		}
	}
	for id := range dead {
		if !permIDs[id] {
			t.Errorf("%s dead, but it fails only once or only as unavailable", id)
		}
	}
	for _, b := range r.src.handedBatches() {
		for _, e := range b.events {
			if !permIDs[e.ID] && !snk.isAcked(e.ID) {
				t.Errorf("event %s never acknowledged", e.ID)
			}
		}
	}
	checkStats(t, r.p.Stats(), int64(n), int64(n-len(permIDs)), int64(len(permIDs)), int64(len(flakyIDs)))
	t.Logf("%d events, %d flaky, %d permanent, %d Publish calls", n, len(flakyIDs), len(permIDs), len(snk.callList()))
}

func src(batches [][]*event.Event) *fakeSource { return newFakeSource(batches...) }

// 2. BatchSize 10 and 100 ready aggregates: Publish calls carry up to 10
// events and up to Concurrency of them run at once.
func TestBatchingAndConcurrency(t *testing.T) {
	var evs []*event.Event
	for i := range 100 {
		evs = append(evs, mkEvent(fmt.Sprintf("e%03d", i), fmt.Sprintf("agg-%03d", i)))
	}
	snk := newFakeSink(func(*event.Event, int) action { return action{hang: true} })
	snk.gate = make(chan struct{})
	opts := testOptions()
	opts.BatchSize = 10
	opts.Concurrency = 8
	r := start(t, newFakeSource(evs), snk, opts)

	waitFor(t, "8 concurrent Publish calls", 5*time.Second, func() bool { return snk.current() == 8 })
	time.Sleep(50 * time.Millisecond) // a 9th call would start now
	if got := len(snk.callList()); got != 8 {
		t.Errorf("%d Publish calls started while 8 hang, want 8 (Concurrency)", got)
	}
	for i, c := range snk.callList() {
		if len(c) != 10 {
			t.Errorf("Publish call %d carried %d events, want 10 (100 aggregates were ready)", i, len(c))
		}
	}
	close(snk.gate)
	waitFor(t, "the batch to complete", 5*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	calls := snk.callList()
	if len(calls) != 10 {
		t.Errorf("%d Publish calls, want 10", len(calls))
	}
	for i, c := range calls {
		if len(c) > 10 {
			t.Errorf("Publish call %d carried %d events, want at most 10", i, len(c))
		}
	}
	if snk.maxCur != 8 {
		t.Errorf("at most %d Publish calls at once, want 8", snk.maxCur)
	}
	checkAllPublished(t, r.src, snk)
}

// 3. A transient failure is retried, the aggregate's next event waits for it,
// and other aggregates keep flowing meanwhile.
func TestTransientFailureRetriedWithoutStallingOthers(t *testing.T) {
	const others = 200
	var batches [][]*event.Event
	first := []*event.Event{mkEvent("s1", "stuck"), mkEvent("s2", "stuck")}
	for i := range others {
		e := mkEvent(fmt.Sprintf("o%03d", i), fmt.Sprintf("agg-%02d", i%40))
		if i < 10 {
			first = append(first, e)
		} else {
			if i%19 == 10 {
				batches = append(batches, nil)
			}
			batches[len(batches)-1] = append(batches[len(batches)-1], e)
		}
	}
	batches = append([][]*event.Event{first}, batches...)

	var snk *fakeSink
	snk = newFakeSink(func(e *event.Event, _ int) action {
		// s1 fails until every other aggregate's event went through: if a
		// stuck aggregate stalled the others it would never succeed.
		if e.ID == "s1" && snk.ackedCount("stuck") < others {
			return action{err: errFlaky}
		}
		return action{delay: 500 * time.Microsecond}
	})
	opts := testOptions()
	opts.BatchSize = 8
	opts.Concurrency = 4
	opts.Retry = Retry{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 100000}
	r := start(t, src(batches), snk, opts)

	waitFor(t, "every batch to complete", 10*time.Second, func() bool { return r.src.countCompleted() == len(batches) })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, r.src, snk)
	fails := snk.attemptsOf("s1") - 1
	if fails < 1 {
		t.Fatalf("s1 attempted %d times, want a failure first", fails+1)
	}
	if got := r.p.Stats().Retries.Load(); got != int64(fails) {
		t.Errorf("Retries = %d, want %d (the failed attempts of s1)", got, fails)
	}
	if got := snk.attemptsOf("s2"); got != 1 {
		t.Errorf("s2 attempted %d times, want 1", got)
	}
	t.Logf("s1 failed %d times while %d events of other aggregates were published", fails, others)
}

// 4. MaxAttempts transient failures dead-letter the event with its last
// error, and its aggregate continues with the next event.
func TestMaxAttemptsDeadLetters(t *testing.T) {
	evs := []*event.Event{mkEvent("x1", "X"), mkEvent("x2", "X")}
	for i := range 15 {
		evs = append(evs, mkEvent(fmt.Sprintf("o%02d", i), fmt.Sprintf("agg-%02d", i)))
	}
	snk := newFakeSink(func(e *event.Event, n int) action {
		if e.ID == "x1" {
			return action{err: fmt.Errorf("attempt %d: %w", n, errFlaky)}
		}
		return action{}
	})
	opts := testOptions()
	opts.BatchSize = 10
	opts.Retry = Retry{Initial: time.Millisecond, Max: 3 * time.Millisecond, MaxAttempts: 3}
	r := start(t, newFakeSource(evs, []*event.Event{mkEvent("x3", "X")}), snk, opts)

	waitFor(t, "both batches to complete", 5*time.Second, func() bool { return r.src.countCompleted() == 2 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	dead := r.src.checkSettledOnce(t)
	snk.checkViolations(t)
	checkOrder(t, r.src, snk, dead)
	d, ok := dead["x1"]
	if !ok || len(dead) != 1 {
		t.Fatalf("dead = %v, want only x1", dead)
	}
	if d.Attempts != 3 || d.Class != "transient" || d.Err != "attempt 3: broker said 503" {
		t.Errorf("x1 dead with attempts %d, class %q, err %q; want 3, transient, %q", d.Attempts, d.Class, d.Err, "attempt 3: broker said 503")
	}
	if d.FirstFailed == 0 || d.LastFailed < d.FirstFailed {
		t.Errorf("x1 failed first at %d, last at %d", d.FirstFailed, d.LastFailed)
	}
	if got := snk.attemptsOf("x1"); got != 3 {
		t.Errorf("sink saw x1 %d times, want 3", got)
	}
	for _, id := range []string{"x2", "x3"} {
		if !snk.isAcked(id) {
			t.Errorf("%s not published after x1 died", id)
		}
	}
	checkStats(t, r.p.Stats(), int64(len(evs)+1), int64(len(evs)), 1, 2)
}

// 5. A permanent failure dead-letters the event at once.
func TestPermanentFailureDeadAtOnce(t *testing.T) {
	evs := []*event.Event{mkEvent("p1", "P"), mkEvent("p2", "P"), mkEvent("q1", "Q")}
	snk := newFakeSink(func(e *event.Event, n int) action {
		if e.ID == "p1" {
			return action{err: fault.AsPermanent(errors.New("message exceeds max_payload"))}
		}
		return action{}
	})
	opts := testOptions()
	opts.Retry.MaxAttempts = 10
	r := start(t, newFakeSource(evs), snk, opts)

	waitFor(t, "the batch to complete", 5*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	dead := r.src.checkSettledOnce(t)
	snk.checkViolations(t)
	checkOrder(t, r.src, snk, dead)
	d, ok := dead["p1"]
	if !ok || len(dead) != 1 {
		t.Fatalf("dead = %v, want only p1", dead)
	}
	if d.Attempts != 1 || d.Class != "permanent" || d.Err != "message exceeds max_payload" {
		t.Errorf("p1 dead with attempts %d, class %q, err %q; want 1, permanent, message exceeds max_payload", d.Attempts, d.Class, d.Err)
	}
	if got := snk.attemptsOf("p1"); got != 1 {
		t.Errorf("sink saw p1 %d times, want 1", got)
	}
	if !snk.isAcked("p2") || !snk.isAcked("q1") {
		t.Errorf("p2 or q1 not published")
	}
	checkStats(t, r.p.Stats(), 3, 2, 1, 0)
}

// 6. While the sink is unreachable nothing counts as an attempt and nothing
// dies, even with MaxAttempts 1; Ready is false during the outage.
func TestUnavailableOutage(t *testing.T) {
	const outage = 300 * time.Millisecond
	var evs []*event.Event
	for i := range 30 {
		evs = append(evs, mkEvent(fmt.Sprintf("e%02d", i), fmt.Sprintf("agg-%d", i%10)))
	}
	errDown := fault.AsUnavailable(errors.New("dial tcp 127.0.0.1:4222: connection refused"))
	var end atomic.Int64 // outage end, unix nanos
	end.Store(time.Now().Add(time.Hour).UnixNano())
	snk := newFakeSink(func(*event.Event, int) action {
		if time.Now().UnixNano() < end.Load() {
			return action{err: errDown}
		}
		return action{}
	})
	opts := testOptions()
	opts.BatchSize = 4
	opts.Retry = Retry{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, MaxAttempts: 1}
	end.Store(time.Now().Add(outage).UnixNano())
	r := start(t, newFakeSource(evs), snk, opts)

	waitFor(t, "Ready to turn false", 5*time.Second, func() bool { return !r.p.Stats().Ready.Load() })
	if time.Now().UnixNano() >= end.Load() {
		t.Log("outage ended before Ready was seen false (slow machine?)")
	}
	waitFor(t, "the batch to complete", 10*time.Second, func() bool { return r.src.countCompleted() == 1 })
	if !r.p.Stats().Ready.Load() {
		t.Errorf("Ready false after the sink came back")
	}
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, r.src, snk)
	checkStats(t, r.p.Stats(), 30, 30, 0, 0)
	calls := len(snk.callList())
	// Backoff during the outage: a spinning relay would make thousands.
	if calls > 300 {
		t.Errorf("%d Publish calls for 30 events over a %s outage; want backoff", calls, outage)
	}
	t.Logf("%d Publish calls", calls)
}

// 7a. Cancelling Run drains: in-flight events are published and their
// batches completed, the source is not read any more, Run returns nil.
func TestGracefulShutdownDrains(t *testing.T) {
	var batches [][]*event.Event
	for b := range 20 {
		var evs []*event.Event
		for j := range 5 {
			i := b*5 + j
			evs = append(evs, mkEvent(fmt.Sprintf("e%03d", i), fmt.Sprintf("agg-%d", i%10)))
		}
		batches = append(batches, evs)
	}
	source := src(batches)
	source.returnLate = true // after its batches, Next blocks until cancel, then returns one anyway
	snk := newFakeSink(func(*event.Event, int) action { return action{delay: 20 * time.Millisecond} })
	opts := testOptions()
	opts.BatchSize = 3
	opts.Concurrency = 2
	r := start(t, source, snk, opts)

	waitFor(t, "all batches to be captured", 5*time.Second, func() bool { return len(source.handedBatches()) == 20 })
	waitFor(t, "publishes in flight", 5*time.Second, func() bool { return snk.current() > 0 })
	inflight := snk.inflightIDs()
	callsAtCancel := source.nextCalls()
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if n := source.nextCalls() - callsAtCancel; n > 1 {
		t.Errorf("source.Next called %d more times after cancel, want at most the one in progress", n)
	}
	source.checkSettledOnce(t)
	snk.checkViolations(t)
	checkOrder(t, source, snk, nil)
	late := 0
	for _, b := range source.handedBatches() {
		if b.late {
			late++
			continue
		}
		if !b.completed() {
			t.Errorf("batch %d (captured before cancel) not completed", b.seq)
		}
	}
	if late != 1 {
		t.Errorf("%d batches returned by Next after cancel, want 1 (abandoned)", late)
	}
	batchOf := map[string]*fakeBatch{}
	for _, b := range source.handedBatches() {
		for _, e := range b.events {
			batchOf[e.ID] = b
		}
	}
	for _, id := range inflight {
		if !snk.isAcked(id) || !batchOf[id].completed() {
			t.Errorf("event %s was in flight at cancel: acknowledged %v, batch completed %v", id, snk.isAcked(id), batchOf[id].completed())
		}
	}
	if got := r.p.Stats().Published.Load(); got != 100 {
		t.Errorf("Published = %d, want 100", got)
	}
	t.Logf("%d events in flight at cancel; drain took %s", len(inflight), r.ended.Sub(r.canceled))
}

// 7b. With a sink that never acknowledges, the drain ends after
// ShutdownTimeout: Run returns nil promptly and every batch is abandoned.
func TestShutdownTimeoutAbandons(t *testing.T) {
	source := &fakeSource{returnLate: true}
	source.gen = func(seq int) []*event.Event {
		var evs []*event.Event
		for j := range 4 {
			evs = append(evs, mkEvent(fmt.Sprintf("b%d-%d", seq, j), fmt.Sprintf("agg-%d", (seq*4+j)%7)))
		}
		return evs
	}
	snk := newFakeSink(func(*event.Event, int) action { return action{hang: true} })
	opts := testOptions()
	opts.ShutdownTimeout = 200 * time.Millisecond
	opts.MaxInFlight = 40
	opts.Concurrency = 3
	r := start(t, source, snk, opts)

	waitFor(t, "the window to fill", 5*time.Second, func() bool { return r.p.Stats().InFlight.Load() >= 40 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if took := r.ended.Sub(r.canceled); took > 2*time.Second {
		t.Errorf("Run returned %s after cancel, want about ShutdownTimeout (200ms)", took)
	}
	source.checkSettledOnce(t)
	snk.checkViolations(t)
	for _, b := range source.handedBatches() {
		if !b.abandoned() {
			t.Errorf("batch %d not abandoned (nothing was ever acknowledged)", b.seq)
		}
	}
	if got := r.p.Stats().Archived.Load(); got != 0 {
		t.Errorf("Archived = %d, want 0", got)
	}
	t.Logf("Run returned %s after cancel; %d batches abandoned", r.ended.Sub(r.canceled), len(source.handedBatches()))
}

// blockingHandler is a slog.Handler that, once armed, blocks the first
// goroutine that logs until release returns. It lets a test hold the
// engine's loop goroutine still at a chosen moment.
type blockingHandler struct {
	armed   atomic.Bool
	once    sync.Once
	release func()
}

func (h *blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *blockingHandler) Handle(context.Context, slog.Record) error {
	if h.armed.Load() {
		h.once.Do(h.release)
	}
	return nil
}
func (h *blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *blockingHandler) WithGroup(string) slog.Handler      { return h }

// 7c. When the shutdown timeout cancels publishes, their results must not
// be settled: a publish cancelled by the pipeline itself is no failed attempt
// of the event, and its batch must be abandoned, not completed (with a dead
// "context canceled" event, through an already-cancelled context).
//
// The loop is held inside the drain log line until the hard timeout has
// cancelled every publish and their results are queued; it then selects
// between the queued results and the hard-timeout case at random, so each
// round shows the bug with probability about 1/2.
func TestShutdownTimeoutDoesNotSettleCancelledPublishes(t *testing.T) {
	const rounds = 16
	for round := range rounds {
		var batches [][]*event.Event
		for i := range 8 {
			batches = append(batches, []*event.Event{mkEvent(fmt.Sprintf("r%d-e%d", round, i), fmt.Sprintf("agg-%d", i))})
		}
		snk := newFakeSink(func(*event.Event, int) action { return action{hang: true} })
		snk.cutErr = func(err error) error { return err } // a sink that does not classify ctx errors: transient
		h := &blockingHandler{}
		h.release = func() {
			deadline := time.Now().Add(5 * time.Second)
			for snk.returnedCount() < 8 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // let the publish goroutines queue their results
		}
		opts := testOptions()
		opts.Logger = slog.New(h)
		opts.BatchSize = 1
		opts.Concurrency = 8
		opts.ShutdownTimeout = 30 * time.Millisecond
		opts.Retry.MaxAttempts = 1
		source := src(batches)
		r := start(t, source, snk, opts)

		waitFor(t, "8 publishes in flight", 5*time.Second, func() bool { return snk.current() == 8 })
		h.armed.Store(true)
		if err := r.stop(t, 10*time.Second); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		source.checkSettledOnce(t)
		snk.checkViolations(t)
		for _, b := range source.handedBatches() {
			completes, ctxErrs, _ := b.state()
			if len(completes) > 0 {
				t.Fatalf("round %d: batch %d (event %s, never acknowledged) was Completed after the shutdown timeout, "+
					"with ctx error %v and outcome published=%d dead=%+v; want Abandon (stats: retries %d, dead %d)",
					round, b.seq, b.events[0].ID, ctxErrs[0], len(completes[0].Published), completes[0].Dead,
					r.p.Stats().Retries.Load(), r.p.Stats().DeadLettered.Load())
			}
		}
		if st := r.p.Stats(); st.Retries.Load() != 0 || st.DeadLettered.Load() != 0 {
			t.Fatalf("round %d: publishes cancelled by the shutdown counted as failures: retries %d, dead %d",
				round, st.Retries.Load(), st.DeadLettered.Load())
		}
	}
}

// 8. Backpressure: once MaxInFlight events, or MaxInFlightBytes of events
// (event.Event.Size), are held the source is not asked for more.
func TestBackpressure(t *testing.T) {
	sized := mkEvent("b000-0", "agg-000-0")
	sized.Payload = make([]byte, 1000)
	for _, tc := range []struct {
		name     string
		payload  int
		count    int // MaxInFlight
		bytes    int // MaxInFlightBytes; 0: the default
		wantHeld int64
	}{
		{"events", 0, 100, 0, 100},
		{"bytes", 1000, 1000, 45 * sized.Size(), 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			source := &fakeSource{}
			source.gen = func(seq int) []*event.Event {
				var evs []*event.Event
				for j := range 10 {
					ev := mkEvent(fmt.Sprintf("b%03d-%d", seq, j), fmt.Sprintf("agg-%03d-%d", seq, j))
					if tc.payload > 0 {
						ev.Payload = make([]byte, tc.payload)
					}
					evs = append(evs, ev)
				}
				return evs
			}
			snk := newFakeSink(func(*event.Event, int) action { return action{hang: true} })
			snk.gate = make(chan struct{})
			opts := testOptions()
			opts.MaxInFlight, opts.MaxInFlightBytes, opts.BatchSize = tc.count, tc.bytes, 10
			r := start(t, source, snk, opts)

			waitFor(t, "the window to fill", 5*time.Second, func() bool { return r.p.Stats().InFlight.Load() == tc.wantHeld })
			time.Sleep(100 * time.Millisecond) // more reads would happen now
			if got := r.p.Stats().InFlight.Load(); got != tc.wantHeld {
				t.Errorf("InFlight = %d with a stalled sink, want %d", got, tc.wantHeld)
			}
			// The reader may hold one batch it read before the window filled
			// up, waiting to hand it over; it must not ask for another.
			batches := int(tc.wantHeld) / 10
			calls, handed := source.nextCalls(), len(source.handedBatches())
			if handed > batches+1 || calls > batches+1 {
				t.Errorf("source.Next called %d times (%d batches) while %d events (%d batches) are held; want at most %d",
					calls, handed, tc.wantHeld, batches, batches+1)
			}
			close(snk.gate)
			waitFor(t, "reading to resume", 5*time.Second, func() bool { return source.countCompleted() >= batches+5 })
			if err := r.stop(t, 5*time.Second); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			source.checkSettledOnce(t)
			snk.checkViolations(t)
		})
	}
}

// 9a. Failing source reads that may pass are retried.
func TestSourceTransientErrorRetried(t *testing.T) {
	batches := randomBatches(rand.New(rand.NewPCG(5, 6)), 50, 10, 10)
	source := src(batches)
	source.errAt = func(call int) error {
		switch call {
		case 1, 2:
			return errors.New("connect: connection refused")
		case 3:
			return fault.AsUnavailable(errors.New("postgres restarting"))
		}
		return nil
	}
	snk := newFakeSink(nil)
	opts := testOptions()
	opts.Retry = Retry{Initial: 2 * time.Millisecond, Max: 10 * time.Millisecond}
	r := start(t, source, snk, opts)

	waitFor(t, "every batch to complete", 5*time.Second, func() bool { return source.countCompleted() == len(batches) })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, source, snk)
	if got := source.nextCalls(); got < 3+len(batches) {
		t.Errorf("Next called %d times, want at least %d", got, 3+len(batches))
	}
}

// 9b. A permanent source error ends Run with that error.
func TestSourcePermanentErrorEndsRun(t *testing.T) {
	base := errors.New(`relation "outbox" does not exist`)
	source := &fakeSource{errAt: func(int) error { return fault.AsPermanent(base) }}
	r := start(t, source, newFakeSink(nil), testOptions())
	err := r.wait(t, 5*time.Second)
	if !errors.Is(err, base) {
		t.Fatalf("Run = %v, want %v", err, base)
	}
	if got := source.nextCalls(); got != 1 {
		t.Errorf("Next called %d times, want 1", got)
	}
}

// 9c. A permanent source error while a publish is in flight: Run must return
// the error promptly and abandon the held batch, not wait for the publish,
// whose context nothing cancels.
func TestSourcePermanentErrorWithPublishInFlight(t *testing.T) {
	base := errors.New("replication slot dropped")
	snk := newFakeSink(func(*event.Event, int) action { return action{hang: true} }) // answers only when ctx ends
	source := newFakeSource([]*event.Event{mkEvent("e1", "A"), mkEvent("e2", "B")})
	source.errAt = func(call int) error {
		if call < 2 {
			return nil
		}
		for deadline := time.Now().Add(5 * time.Second); snk.current() == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return fault.AsPermanent(base)
	}
	opts := testOptions()
	opts.ShutdownTimeout = 100 * time.Millisecond
	r := start(t, source, snk, opts)

	const guard = time.Second
	select {
	case <-r.finished:
	case <-time.After(guard):
		t.Errorf("BUG: Run did not return within %s of a permanent source error: it waits for an in-flight "+
			"publish whose context is only cancelled after the Run context is (pipeline.go Run: e.wait() before cancelHard)", guard)
		r.cancel() // unblock: the shutdown timer then cancels the publish
		<-r.finished
	}
	if !errors.Is(r.err, base) {
		t.Errorf("Run = %v, want %v", r.err, base)
	}
	source.checkSettledOnce(t)
	for _, b := range source.handedBatches() {
		if !b.abandoned() {
			t.Errorf("batch %d not abandoned after the source failed", b.seq)
		}
	}
}

// Completing an empty batch: nothing to publish, completed at once.
func TestEmptyBatchCompleted(t *testing.T) {
	source := newFakeSource(nil, []*event.Event{mkEvent("e1", "A")}, nil)
	snk := newFakeSink(nil)
	r := start(t, source, snk, testOptions())
	waitFor(t, "3 batches to complete", 5*time.Second, func() bool { return source.countCompleted() == 3 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, source, snk)
	for _, b := range source.handedBatches() {
		if c, _, _ := b.state(); len(b.events) == 0 && (len(c[0].Published) != 0 || len(c[0].Dead) != 0) {
			t.Errorf("empty batch %d completed with outcome %+v", b.seq, c[0])
		}
	}
}

var _ capture.Source = (*fakeSource)(nil)
var _ sink.Sink = (*fakeSink)(nil)

// Transient failures wait for the backoff between attempts instead of
// hammering the sink.
func TestTransientRetryBacksOff(t *testing.T) {
	snk := newFakeSink(func(e *event.Event, _ int) action {
		if e.ID == "f1" {
			return action{err: errFlaky}
		}
		return action{}
	})
	opts := testOptions()
	opts.Retry = Retry{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond, MaxAttempts: 1 << 30}
	opts.ShutdownTimeout = 50 * time.Millisecond
	r := start(t, newFakeSource([]*event.Event{mkEvent("f1", "F"), mkEvent("g1", "G")}), snk, opts)
	waitFor(t, "g1 to be published", 5*time.Second, func() bool { return snk.isAcked("g1") })
	time.Sleep(200 * time.Millisecond)
	// Mean delay 5ms: about 40 attempts; without backoff, thousands.
	if n := snk.attemptsOf("f1"); n < 2 || n > 400 {
		t.Errorf("f1 attempted %d times in 200ms with a 10ms full-jitter backoff, want about 40", n)
	}
	// The drain retries f1 until ShutdownTimeout, then abandons its batch.
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	r.src.checkSettledOnce(t)
	snk.checkViolations(t)
}

// TestMaxBatchBytes: a Publish call holds at most MaxBatchBytes of events
// (event.Event.Size), and an event larger than that is published alone.
func TestMaxBatchBytes(t *testing.T) {
	var evs []*event.Event
	sizes := map[string]int{}
	for i := range 40 {
		ev := mkEvent(fmt.Sprintf("e%02d", i), fmt.Sprintf("agg-%02d", i))
		ev.Payload = make([]byte, 3000)
		if i%10 == 0 {
			ev.Payload = make([]byte, 25_000) // over MaxBatchBytes
		}
		evs = append(evs, ev)
		sizes[ev.ID] = ev.Size()
	}
	source := src([][]*event.Event{evs[:20], evs[20:]})
	snk := newFakeSink(nil)
	opts := testOptions()
	opts.MaxBatchBytes = 10_000
	r := start(t, source, snk, opts)
	waitFor(t, "every batch to complete", 10*time.Second, func() bool { return source.countCompleted() == 2 })
	if err := r.stop(t, 5*time.Second); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	checkAllPublished(t, source, snk)
	for _, call := range snk.callList() {
		total := 0
		for _, id := range call {
			total += sizes[id]
		}
		if total > opts.MaxBatchBytes && len(call) > 1 {
			t.Errorf("Publish of %v holds %d bytes, more than MaxBatchBytes %d", call, total, opts.MaxBatchBytes)
		}
	}
}

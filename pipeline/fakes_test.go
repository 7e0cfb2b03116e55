package pipeline

// In-memory fakes of capture.Source and sink.Sink, and helpers shared by the
// pipeline tests.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// ---------------------------------------------------------------------------
// events

var posCounter atomic.Uint64

func mkEvent(id, agg string) *event.Event {
	return &event.Event{
		ID:            id,
		AggregateType: "order",
		AggregateID:   agg,
		EventType:     "created",
		Payload:       []byte(`{}`),
		ContentType:   event.ContentTypeJSON,
		Position:      posCounter.Add(1),
	}
}

// hashOf gives a stable pseudo-random number per event id, so scripts that
// run on many goroutines need no shared random source.
func hashOf(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testOptions are fast defaults for tests.
func testOptions() Options {
	return Options{
		Logger:          discardLogger(),
		Retry:           Retry{Initial: time.Millisecond, Max: 5 * time.Millisecond, MaxAttempts: 10},
		ShutdownTimeout: 5 * time.Second,
	}
}

// ---------------------------------------------------------------------------
// fake source

type fakeBatch struct {
	src    *fakeSource
	seq    int
	events []*event.Event
	late   bool // handed out by Next when its ctx was already done

	mu              sync.Mutex
	completes       []capture.Outcome
	completeCtxErrs []error // ctx.Err() seen by each Complete
	abandons        int
}

func (b *fakeBatch) Events() []*event.Event { return b.events }

func (b *fakeBatch) Complete(ctx context.Context, o capture.Outcome) error {
	cp := capture.Outcome{Published: slices.Clone(o.Published), Dead: slices.Clone(o.Dead)}
	b.mu.Lock()
	b.completes = append(b.completes, cp)
	b.completeCtxErrs = append(b.completeCtxErrs, ctx.Err())
	b.mu.Unlock()
	b.src.noteSettled(b, "Complete")
	return nil
}

func (b *fakeBatch) Abandon(ctx context.Context) {
	b.mu.Lock()
	b.abandons++
	b.mu.Unlock()
	b.src.noteSettled(b, "Abandon")
}

func (b *fakeBatch) state() (completes []capture.Outcome, ctxErrs []error, abandons int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.completes), slices.Clone(b.completeCtxErrs), b.abandons
}

func (b *fakeBatch) completed() bool {
	c, _, _ := b.state()
	return len(c) > 0
}

func (b *fakeBatch) abandoned() bool {
	_, _, a := b.state()
	return a > 0
}

// fakeSource hands out prepared batches in order, then batches made by gen,
// then blocks until ctx is done. Next errors can be scripted per call.
type fakeSource struct {
	mu         sync.Mutex
	queue      []*fakeBatch
	gen        func(seq int) []*event.Event // makes the next batch when queue is empty; nil: none
	errAt      func(call int) error         // scripted error of the call-th Next (1-based)
	returnLate bool                         // when ctx is done, still return a batch (it must be abandoned)
	calls      int
	lateCalls  int // Next calls entered with ctx already done
	handed     []*fakeBatch
	seq        int
	settled    atomic.Int64
	runDone    atomic.Bool // set once Run has returned
	violations []string
}

func newFakeSource(batches ...[]*event.Event) *fakeSource {
	s := &fakeSource{}
	for _, evs := range batches {
		s.queue = append(s.queue, s.newBatch(evs))
	}
	return s
}

func (s *fakeSource) newBatch(evs []*event.Event) *fakeBatch {
	s.seq++
	return &fakeBatch{src: s, seq: s.seq, events: evs}
}

func (s *fakeSource) violate(format string, args ...any) {
	s.mu.Lock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *fakeSource) noteSettled(b *fakeBatch, how string) {
	if s.runDone.Load() {
		s.violate("batch %d: %s called after Run returned", b.seq, how)
	}
	s.settled.Add(1)
}

func (s *fakeSource) Next(ctx context.Context) (capture.Batch, error) {
	s.mu.Lock()
	s.calls++
	call := s.calls
	if s.runDone.Load() {
		s.violations = append(s.violations, "Next called after Run returned")
	}
	s.mu.Unlock()
	if s.errAt != nil {
		if err := s.errAt(call); err != nil {
			return nil, err
		}
	}
	if ctx.Err() == nil {
		s.mu.Lock()
		var b *fakeBatch
		switch {
		case len(s.queue) > 0:
			b, s.queue = s.queue[0], s.queue[1:]
		case s.gen != nil:
			b = s.newBatch(s.gen(s.seq + 1))
		}
		if b != nil {
			b.late = ctx.Err() != nil
			s.handed = append(s.handed, b)
			s.mu.Unlock()
			return b, nil
		}
		s.mu.Unlock()
		<-ctx.Done()
	} else {
		s.mu.Lock()
		s.lateCalls++
		s.mu.Unlock()
	}
	if !s.returnLate {
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.newBatch([]*event.Event{mkEvent(fmt.Sprintf("late-%d", s.seq+1), "late-aggregate")})
	b.late = true
	s.handed = append(s.handed, b)
	return b, nil
}

func (s *fakeSource) Close() error { return nil }

func (s *fakeSource) handedBatches() []*fakeBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.handed)
}

func (s *fakeSource) nextCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *fakeSource) countCompleted() int {
	n := 0
	for _, b := range s.handedBatches() {
		if b.completed() {
			n++
		}
	}
	return n
}

// checkSettledOnce fails t unless every handed batch got exactly one call of
// Complete or Abandon, every completed batch accounts for each of its events
// exactly once (published or dead), late batches were abandoned, and no
// violation was recorded. It returns the dead events by id.
func (s *fakeSource) checkSettledOnce(t *testing.T) map[string]capture.DeadEvent {
	t.Helper()
	s.mu.Lock()
	for _, v := range s.violations {
		t.Errorf("source: %s", v)
	}
	s.mu.Unlock()
	dead := map[string]capture.DeadEvent{}
	for _, b := range s.handedBatches() {
		completes, _, abandons := b.state()
		if n := len(completes) + abandons; n != 1 {
			t.Errorf("batch %d: Complete called %d times, Abandon %d times; want exactly one call in all", b.seq, len(completes), abandons)
			continue
		}
		if b.late && abandons != 1 {
			t.Errorf("batch %d was returned by Next after cancel but was not abandoned", b.seq)
		}
		if len(completes) == 0 {
			continue
		}
		o := completes[0]
		want := map[string]bool{}
		for _, e := range b.events {
			want[e.ID] = true
		}
		seen := map[string]bool{}
		note := func(e *event.Event, what string) {
			switch {
			case !want[e.ID]:
				t.Errorf("batch %d: %s event %s is not in the batch", b.seq, what, e.ID)
			case seen[e.ID]:
				t.Errorf("batch %d: event %s settled twice in the outcome", b.seq, e.ID)
			}
			seen[e.ID] = true
		}
		for _, e := range o.Published {
			note(e, "published")
		}
		for _, d := range o.Dead {
			note(d.Event, "dead")
			dead[d.Event.ID] = d
		}
		if len(seen) != len(want) {
			t.Errorf("batch %d completed with %d of its %d events settled", b.seq, len(seen), len(want))
		}
	}
	return dead
}

// ---------------------------------------------------------------------------
// fake sink

// action scripts what the sink does with one event of a Publish call.
type action struct {
	delay time.Duration // before answering
	err   error         // nil: acknowledged
	hang  bool          // answer only when ctx is done or the gate opens
}

type attemptRec struct {
	id  string
	err error
}

// fakeSink publishes by script. It records every attempt in order and flags
// a violation when two events of one aggregate are in flight at once.
type fakeSink struct {
	script func(e *event.Event, attempt int) action
	gate   chan struct{}     // closing it releases hanging publishes
	cutErr func(error) error // the error of an event whose wait ctx cut; default AsUnavailable

	mu         sync.Mutex
	attempts   map[string]int
	acked      map[string]int
	inflight   map[string]string // aggregate → event id being published
	perAgg     map[string][]attemptRec
	calls      [][]string // event ids of each Publish, in start order
	cur        int
	maxCur     int
	maxBatch   int
	returned   int
	violations []string
}

func newFakeSink(script func(e *event.Event, attempt int) action) *fakeSink {
	return &fakeSink{
		script:   script,
		attempts: map[string]int{},
		acked:    map[string]int{},
		inflight: map[string]string{},
		perAgg:   map[string][]attemptRec{},
	}
}

func (s *fakeSink) Publish(ctx context.Context, batch []*event.Event) error {
	s.mu.Lock()
	s.cur++
	s.maxCur = max(s.maxCur, s.cur)
	s.maxBatch = max(s.maxBatch, len(batch))
	if len(batch) == 0 {
		s.violations = append(s.violations, "Publish called with an empty batch")
	}
	ids := make([]string, len(batch))
	nums := make([]int, len(batch))
	inBatch := map[string]bool{}
	for i, e := range batch {
		ids[i] = e.ID
		if inBatch[e.Key()] {
			s.violations = append(s.violations, fmt.Sprintf("aggregate %s appears twice in one Publish call %v", e.Key(), ids))
		}
		inBatch[e.Key()] = true
		if other, busy := s.inflight[e.Key()]; busy {
			s.violations = append(s.violations, fmt.Sprintf("aggregate %s: %s published while %s is in flight", e.Key(), e.ID, other))
		}
		s.inflight[e.Key()] = e.ID
		s.attempts[e.ID]++
		nums[i] = s.attempts[e.ID]
	}
	s.calls = append(s.calls, ids)
	s.mu.Unlock()

	acts := make([]action, len(batch))
	var wait time.Duration
	hang := false
	for i, e := range batch {
		if s.script != nil {
			acts[i] = s.script(e, nums[i])
		}
		wait = max(wait, acts[i].delay)
		hang = hang || acts[i].hang
	}
	var cut error
	if hang {
		select {
		case <-ctx.Done():
			cut = ctx.Err()
		case <-s.gate:
		}
	} else if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			cut = ctx.Err()
		}
		t.Stop()
	}

	errs := make([]error, len(batch))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range batch {
		err := acts[i].err
		if cut != nil {
			err = fault.AsUnavailable(cut)
			if s.cutErr != nil {
				err = s.cutErr(cut)
			}
		}
		errs[i] = err
		delete(s.inflight, e.Key())
		s.perAgg[e.Key()] = append(s.perAgg[e.Key()], attemptRec{id: e.ID, err: err})
		if err == nil {
			if s.acked[e.ID]++; s.acked[e.ID] > 1 {
				s.violations = append(s.violations, fmt.Sprintf("event %s acknowledged %d times", e.ID, s.acked[e.ID]))
			}
		}
	}
	s.cur--
	s.returned++
	return combine(errs)
}

// combine builds Publish's result the way real sinks do: nil, the error
// itself for a single event or a batch that failed as one, else a
// *sink.BatchError.
func combine(errs []error) error {
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	switch {
	case failed == 0:
		return nil
	case len(errs) == 1:
		return errs[0]
	case failed == len(errs) && !slices.ContainsFunc(errs, func(e error) bool { return e != errs[0] }):
		return errs[0]
	default:
		return &sink.BatchError{Errs: errs}
	}
}

func (s *fakeSink) Close() error { return nil }

func (s *fakeSink) ackedCount(skipAgg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for agg, recs := range s.perAgg {
		if agg == skipAgg {
			continue
		}
		for _, r := range recs {
			if r.err == nil {
				n++
			}
		}
	}
	return n
}

func (s *fakeSink) attemptsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[id]
}

func (s *fakeSink) isAcked(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked[id] > 0
}

func (s *fakeSink) current() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *fakeSink) returnedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.returned
}

func (s *fakeSink) callList() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *fakeSink) inflightIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, id := range s.inflight {
		ids = append(ids, id)
	}
	return ids
}

func (s *fakeSink) checkViolations(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.violations {
		t.Errorf("sink: %s", v)
	}
}

// checkOrder fails t unless, for each aggregate, the publish attempts the
// sink saw walk the aggregate's events in source order: they start at its
// first event, repeat an event only while it is failing, and move on to the
// next event only after the current one was acknowledged or dead-lettered.
// So no event is ever attempted before an older event of its aggregate was
// settled, and the first successful publishes are in source order.
func checkOrder(t *testing.T, src *fakeSource, snk *fakeSink, dead map[string]capture.DeadEvent) {
	t.Helper()
	for _, p := range orderProblems(src, snk, dead) {
		t.Error(p)
	}
}

func orderProblems(src *fakeSource, snk *fakeSink, dead map[string]capture.DeadEvent) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	index := map[string]int{} // id → position within its aggregate
	order := map[string][]string{}
	for _, b := range src.handedBatches() {
		for _, e := range b.events {
			index[e.ID] = len(order[e.Key()])
			order[e.Key()] = append(order[e.Key()], e.ID)
		}
	}
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for agg, recs := range snk.perAgg {
		pos := 0
		for i, r := range recs {
			at, ok := index[r.id]
			if !ok {
				bad("aggregate %s: sink saw unknown event %s", agg, r.id)
				break
			}
			if i == 0 {
				if at != 0 {
					bad("aggregate %s: first attempt is %s (#%d), not its first event %s", agg, r.id, at, order[agg][0])
				}
				pos = at
				continue
			}
			prev := recs[i-1]
			switch {
			case at == pos:
				if prev.err == nil {
					bad("aggregate %s: %s published again after it was acknowledged", agg, r.id)
				}
			case at == pos+1:
				if _, isDead := dead[prev.id]; prev.err != nil && !isDead {
					bad("aggregate %s: %s attempted while the older %s had failed (%v) and was neither acknowledged nor dead", agg, r.id, prev.id, prev.err)
				}
			default:
				bad("aggregate %s: attempt of %s (#%d) follows %s (#%d): out of source order", agg, r.id, at, prev.id, pos)
			}
			pos = at
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// running a pipeline

type runner struct {
	p        *Pipeline
	src      *fakeSource
	cancel   context.CancelFunc
	finished chan struct{}
	err      error
	canceled time.Time
	ended    time.Time
}

func start(t *testing.T, src *fakeSource, snk sink.Sink, opts Options) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{p: New(src, snk, opts), src: src, cancel: cancel, finished: make(chan struct{})}
	go func() {
		defer close(r.finished)
		r.err = r.p.Run(ctx)
		r.ended = time.Now()
		src.runDone.Store(true)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.finished:
		case <-time.After(20 * time.Second):
			t.Errorf("Run still running 20s after the test ended")
		}
	})
	return r
}

// stop cancels the Run context and waits for Run to return; it fails t when
// Run takes longer than guard.
func (r *runner) stop(t *testing.T, guard time.Duration) error {
	t.Helper()
	r.canceled = time.Now()
	r.cancel()
	return r.wait(t, guard)
}

func (r *runner) wait(t *testing.T, guard time.Duration) error {
	t.Helper()
	select {
	case <-r.finished:
		return r.err
	case <-time.After(guard):
		t.Fatalf("Run did not return within %s", guard)
		return nil
	}
}

// waitFor polls cond until it holds; the timeout only guards against hangs.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

var errFlaky = errors.New("broker said 503")

package pipeline

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
)

// item is one event waiting in its aggregate's queue.
type item struct {
	ev          *event.Event
	batch       *batchState
	attempts    int
	firstFailed time.Time
	lastErr     error
	dest        *destState
	streakGen   int // see destLevel
}

// batchState tracks how many events of a captured batch are unsettled.
type batchState struct {
	batch   capture.Batch
	pending int
	outcome capture.Outcome
	archive *archiveState
}

// aggQueue holds an aggregate's events in source order. Only its first
// events are ever published, by one Publish call at a time: the head alone,
// or with a sink.Ordered sink up to perAggregate events that share the
// head's destination.
type aggQueue struct {
	id      string
	items   []*item
	sending int       // how many of the first items are being published
	retryAt time.Time // the head waits for a retry until then
	queued  bool      // in the ready list
	held    bool      // held by its destination's open breaker
	probe   bool      // its head is sent as its destination's probe
	heapIdx int
	first   [1]*item // items' first backing array, so one event needs no other
}

// run is the first n events of an aggregate's queue in one Publish call.
type run struct {
	q *aggQueue
	n int
}

// result is the outcome of one Publish call; its batch holds the runs'
// events one run after another.
type result struct {
	runs []run
	err  error
}

// engine is the pipeline's state; it is owned by the goroutine running loop.
type engine struct {
	p        *Pipeline
	ctx      context.Context // publishes and archives; ends after the drain
	queues   map[string]*aggQueue
	spare    []*aggQueue // emptied queues for reuse, at most maxSpare
	ready    []*aggQueue // aggregates whose head can be sent, from readyAt on
	readyAt  int
	retries  retryHeap
	held     int // events captured and not settled
	bytes    int // their size (event.Event.Size)
	inFlight int
	results  chan result
	done     completer
	timer    *time.Timer
	parked   map[string]*park // see park.go
	swept    captureMark      // the capture mark of the last sweep of parked
	perAgg   int              // most events of one aggregate in a Publish call (sink.Ordered)
	settles  uint64           // Publish results applied; see destState.okIn

	holder     capture.Holder    // the source, when it holds aggregates in the outbox (see held.go)
	keyBytes   int               // the held keys' bytes, see maxHeldKeyBytes
	probeBytes int               // the probe candidates' copies' bytes, see maxProbeBytes
	router     sink.Destinations // nil when the sink names no destinations
	rowChosen  bool              // row values choose the destinations (sink.RowRouted), Broker aside
	dests      map[string]*destState
	broken     int // destinations whose breaker is open
	probes     chan probeResult
	probesOut  int       // idle probes running
	nextIdle   time.Time // when idle destinations are probed next
}

func newEngine(p *Pipeline, ctx context.Context) *engine {
	e := &engine{
		p:       p,
		ctx:     ctx,
		queues:  make(map[string]*aggQueue),
		parked:  make(map[string]*park),
		results: make(chan result, p.opts.Concurrency),
		done: completer{ctx: ctx, st: &p.stats, gen: &p.completed, fails: outage.New(p.log,
			"archive failed; the batch's events will be captured and published again with the same message_id", "archiving works again")},
		timer:    time.NewTimer(time.Hour),
		dests:    make(map[string]*destState),
		probes:   make(chan probeResult),
		nextIdle: time.Now(),
	}
	e.router, _ = p.snk.(sink.Destinations)
	e.rowChosen = e.router != nil && sink.RowChosen(p.snk)
	e.holder = p.opts.Holder
	if e.holder == nil {
		e.holder, _ = p.src.(capture.Holder)
	}
	e.perAgg = 1
	if o, ok := p.snk.(sink.Ordered); ok {
		e.perAgg = max(o.MaxPerAggregate(), 1)
	}
	e.publishStatus()
	return e
}

// loop runs until the drain after ctx's end finishes or the source fails.
// readDone is closed when the reader stopped; readErr then tells why.
func (e *engine) loop(ctx context.Context, batches <-chan captured, readDone <-chan struct{}, readErr func() error) error {
	draining := false
	for {
		e.dispatch()
		if draining && e.held == 0 && e.inFlight == 0 {
			return nil
		}
		in := batches
		if draining || e.held >= e.p.opts.MaxInFlight || e.bytes >= e.p.opts.MaxInFlightBytes {
			in = nil
		}
		e.armTimer()
		select {
		case b := <-in:
			e.add(b)
		case r := <-e.results:
			e.settle(r)
		case r := <-e.probes:
			e.probed(r, time.Now())
		case <-e.timer.C:
			e.wake(time.Now())
		case <-readDone:
			if err := readErr(); !errors.Is(err, context.Canceled) {
				e.abandonAll()
				return err
			}
			readDone = nil
		case <-ctx.Done():
			if !draining {
				draining = true
				e.p.log.Info("draining in-flight events", "events", e.held)
			}
			ctx = context.Background()
		case <-e.ctx.Done():
			e.p.log.Warn("shutdown timeout: abandoning unpublished events; they will be published after restart", "events", e.held)
			e.abandonAll()
			return nil
		}
	}
}

// wait blocks until in-flight publishes and completions have returned.
func (e *engine) wait() {
	for e.inFlight > 0 || e.probesOut > 0 {
		select {
		case <-e.results:
			e.inFlight--
		case <-e.probes:
			e.probesOut--
		}
	}
	e.done.wg.Wait()
}

func (e *engine) add(c captured) {
	evs := c.batch.Events()
	bs := &batchState{batch: c.batch, pending: len(evs), archive: new(archiveState)}
	bs.outcome.Published = make([]*event.Event, 0, len(evs))
	e.sweep(c.at)
	e.p.stats.Captured.Add(int64(len(evs)))
	e.held += len(evs)
	if len(evs) == 0 {
		e.done.complete(bs)
		return
	}
	now := time.Now()
	items := make([]item, len(evs)) // one allocation for the batch's items
	for i, ev := range evs {
		e.bytes += ev.Size()
		d := e.route(ev, now)
		d.events++
		key := ev.Key()
		it := &items[i]
		*it = item{ev: ev, batch: bs, dest: d}
		if e.parkedNow(key, it, c) {
			continue
		}
		q := e.queues[key]
		if q == nil {
			q = e.newQueue(key)
			e.queues[key] = q
		}
		q.items = append(q.items, it)
		e.markReady(q)
	}
	e.p.stats.InFlight.Store(int64(e.held))
}

// newQueue returns an empty queue for aggregate key, a spare one when
// there is one.
func (e *engine) newQueue(key string) *aggQueue {
	var q *aggQueue
	if n := len(e.spare); n > 0 {
		q = e.spare[n-1]
		e.spare[n-1] = nil
		e.spare = e.spare[:n-1]
	} else {
		q = new(aggQueue)
	}
	*q = aggQueue{id: key, heapIdx: -1}
	q.items = q.first[:0]
	return q
}

// maxSpare is how many emptied queues the engine keeps for reuse.
const maxSpare = 1024

func (e *engine) markReady(q *aggQueue) {
	if q.queued || q.sending > 0 || q.held || q.heapIdx >= 0 || len(q.items) == 0 {
		return
	}
	q.queued = true
	if len(e.ready) == cap(e.ready) && e.readyAt >= len(e.ready)/2 {
		// Taken entries make up half the array: move the rest to its start.
		n := copy(e.ready, e.ready[e.readyAt:])
		clear(e.ready[n:])
		e.ready, e.readyAt = e.ready[:n], 0
	}
	e.ready = append(e.ready, q)
}

// popReady takes the first aggregate of the ready list. When the list
// empties its backing array is kept for the next ones.
func (e *engine) popReady() *aggQueue {
	q := e.ready[e.readyAt]
	e.ready[e.readyAt] = nil
	e.readyAt++
	if e.readyAt == len(e.ready) {
		e.ready, e.readyAt = e.ready[:0], 0
	}
	q.queued = false
	return q
}

// dispatch starts Publish calls while there is capacity and ready heads.
// A head whose destination is broken is held, unless it is the probe.
func (e *engine) dispatch() {
	e.dueProbes(time.Now())
	for e.inFlight < e.p.opts.Concurrency && len(e.ready) > 0 {
		size := min(e.p.opts.BatchSize, e.held)
		runs := make([]run, 0, min(size, len(e.ready)-e.readyAt))
		batch := make([]*event.Event, 0, size)
		bytes := 0
		untracked := false // the call probes a row-chosen destination: not for StallAfter
		for len(e.ready) > 0 && len(batch) < e.p.opts.BatchSize {
			if len(batch) > 0 && bytes+e.ready[e.readyAt].items[0].ev.Size() > e.p.opts.MaxBatchBytes {
				break // an event larger than MaxBatchBytes goes alone
			}
			q := e.popReady()
			if d := q.items[0].dest; d.open && !d.expired && !q.probe {
				e.hold(d, q)
				continue
			}
			untracked = untracked || q.probe && e.chosen(q.items[0].dest)
			n := e.runLength(q, e.p.opts.BatchSize-len(batch), e.p.opts.MaxBatchBytes-bytes)
			q.sending = n
			runs = append(runs, run{q: q, n: n})
			for _, it := range q.items[:n] {
				batch = append(batch, it.ev)
				bytes += it.ev.Size()
			}
		}
		if len(runs) == 0 {
			continue
		}
		e.inFlight++
		go func() {
			start := time.Now()
			var call uint64 // 0: not tracked, end ignores it
			if !untracked {
				call = e.p.stats.publishing.begin(start)
			}
			err := e.p.snk.Publish(e.ctx, batch)
			e.p.stats.publishing.end(call)
			e.p.opts.Metrics.publishDone(time.Since(start))
			e.results <- result{runs: runs, err: err}
		}()
	}
}

// runLength returns how many of q's first events go in one Publish call
// with room for at most room more events and roomBytes more bytes
// (event.Event.Size): the head alone, or with a sink.Ordered sink up to
// perAgg consecutive events sharing the head's destination. A probe is the
// head alone.
func (e *engine) runLength(q *aggQueue, room, roomBytes int) int {
	limit := min(e.perAgg, room, len(q.items))
	if q.probe {
		limit = 1
	}
	n, d, bytes := 1, q.items[0].dest, q.items[0].ev.Size()
	for n < limit && q.items[n].dest == d && bytes+q.items[n].ev.Size() <= roomBytes {
		bytes += q.items[n].ev.Size()
		n++
	}
	return n
}

// settle applies the result of one Publish call. Each run's events count as
// published up to its first failure; that event is handled as the head of
// its queue: a failure of the destination holds the aggregate without
// counting an attempt, a failure of the event counts one and retries or
// dead-letters it. The run's later events stay queued behind it, whatever
// the sink reported for them, and count no attempt.
func (e *engine) settle(r result) {
	e.inFlight--
	if e.ctx.Err() != nil {
		return // the drain timed out: loop abandons every unsettled batch
	}
	now := time.Now()
	e.settles++
	off := 0
	for _, rn := range r.runs {
		for j, it := range rn.q.items[:rn.n] {
			err := sink.Failed(r.err, off+j)
			if err == nil {
				it.dest.okIn = e.settles
				continue
			}
			if fault.IsSuspect(err) && !heldBack(err, j) {
				e.suspected(it)
			}
			break
		}
		off += rn.n
	}
	off = 0
	for _, rn := range r.runs {
		e.settleRun(rn, r.err, off, now)
		off += rn.n
	}
}

// heldBack reports whether err, the failure of the j-th event of a run, is
// a sink.Ordered sink holding the event back rather than a failure of it.
func heldBack(err error, j int) bool {
	return j > 0 && errors.Is(err, sink.ErrHeldBack)
}

// settleRun settles one run whose first event is at index off of the batch.
func (e *engine) settleRun(rn run, batchErr error, off int, now time.Time) {
	q, probe := rn.q, rn.q.probe
	q.probe = false
	if probe {
		q.items[0].dest.probing = false
	}
	var err error
	j := 0
	for ; j < rn.n; j++ {
		it := q.items[0]
		it.dest.lastUsed = now
		if err = sink.Failed(batchErr, off+j); err != nil {
			break
		}
		e.ok(it.dest, probe, now)
		e.p.opts.Metrics.acked(it.ev, now)
		e.popHead(q, nil, now)
	}
	q.sending = 0
	if err == nil || heldBack(err, j) {
		e.next(q)
		return
	}
	it := q.items[0]
	d := it.dest
	it.lastErr = err
	class := fault.ClassOf(err)
	e.p.opts.Metrics.failed(class)
	destLevel := e.destLevel(d, it, err, d.okIn == e.settles)
	if destLevel {
		e.trip(d, err, probe, now)
	}
	switch {
	case destLevel && !d.expired:
		e.hold(d, q)
	case it.batch == nil:
		e.dropProbe(d, q, destLevel, now)
	case destLevel:
		it.lastErr = fmt.Errorf("destination broken for %s, longer than sink.held_max_age: %w",
			now.Sub(d.since).Round(time.Second), err)
		e.failed(it, fault.Permanent, now)
		e.dead(q, it, now)
	case e.failed(it, class, now):
		e.dead(q, it, now)
	default:
		e.p.stats.Retries.Add(1)
		q.retryAt = now.Add(e.p.opts.Retry.delay(it.attempts))
		heap.Push(&e.retries, q)
	}
}

// dead dead-letters it, the head of q, and moves q on.
func (e *engine) dead(q *aggQueue, it *item, now time.Time) {
	bs := it.batch
	e.popHead(q, it, now)
	if e.p.opts.ParkAggregate {
		e.parkAggregate(q, bs)
	}
	e.next(q)
}

// failed counts a failed attempt of it and reports whether it is dead.
func (e *engine) failed(it *item, class fault.Class, now time.Time) bool {
	it.attempts++
	if it.firstFailed.IsZero() {
		it.firstFailed = now
	}
	dead := class == fault.Permanent || it.attempts >= e.p.opts.Retry.MaxAttempts
	lvl := e.p.log.Warn
	if dead {
		lvl = e.p.log.Error
	}
	lvl("publish failed", "message_id", rowtext.Value(it.ev.ID), "aggregate_id", rowtext.Value(it.ev.AggregateID),
		"attempt", it.attempts, "class", class.String(), "dead_letter", dead, "err", rowtext.Error(it.lastErr.Error()))
	return dead
}

// popHead settles the head of q: published when dead is nil,
// dead-lettered otherwise.
func (e *engine) popHead(q *aggQueue, dead *item, now time.Time) {
	it := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	bs := it.batch
	if bs == nil { // a held event's copy, sent as a probe (see held.go)
		e.dropCopy(it)
		if dead == nil {
			e.p.stats.Published.Add(1)
		}
		return
	}
	if dead == nil {
		bs.outcome.Published = append(bs.outcome.Published, it.ev)
		e.p.stats.Published.Add(1)
	} else {
		bs.outcome.Dead = append(bs.outcome.Dead, capture.DeadEvent{
			Event: it.ev, Err: it.lastErr.Error(), Class: fault.ClassOf(it.lastErr).String(),
			Attempts: it.attempts, FirstFailed: it.firstFailed.UnixNano(), LastFailed: now.UnixNano(),
		})
		e.p.stats.DeadLettered.Add(1)
	}
	e.release(it)
	if bs.pending--; bs.pending == 0 {
		e.done.complete(bs)
	}
}

// next forgets q when it is empty, keeping it as a spare, and marks it
// ready otherwise.
func (e *engine) next(q *aggQueue) {
	if len(q.items) == 0 {
		delete(e.queues, q.id)
		if len(e.spare) < maxSpare {
			*q = aggQueue{}
			e.spare = append(e.spare, q)
		}
		return
	}
	e.markReady(q)
}

// release counts it out of the window.
func (e *engine) release(it *item) {
	it.dest.events--
	e.held--
	e.bytes -= it.ev.Size()
	e.p.stats.InFlight.Store(int64(e.held))
}

// wake moves aggregates whose retry is due back to the ready list, and
// starts the idle probes when due.
func (e *engine) wake(now time.Time) {
	if !now.Before(e.nextIdle) {
		e.idleProbes(now)
	}
	for e.retries.Len() > 0 && !e.retries[0].retryAt.After(now) {
		q := heap.Pop(&e.retries).(*aggQueue)
		e.markReady(q)
	}
}

// armTimer sets the timer to the next retry, probe or idle probe.
func (e *engine) armTimer() {
	next := e.nextProbe()
	if e.retries.Len() > 0 && (next.IsZero() || e.retries[0].retryAt.Before(next)) {
		next = e.retries[0].retryAt
	}
	if e.router != nil && (next.IsZero() || e.nextIdle.Before(next)) {
		next = e.nextIdle
	}
	d := time.Hour
	if !next.IsZero() {
		d = max(time.Until(next), 0)
	}
	e.timer.Reset(d)
}

// abandonAll gives every unsettled batch back to its source.
func (e *engine) abandonAll() {
	seen := make(map[*batchState]bool)
	for _, q := range e.queues {
		for _, it := range q.items {
			if it.batch != nil && !seen[it.batch] {
				seen[it.batch] = true
				it.batch.batch.Abandon(context.WithoutCancel(e.ctx))
			}
		}
	}
	e.queues = map[string]*aggQueue{}
	for _, d := range e.dests {
		d.waiting, d.events, d.probes = nil, 0, 0
	}
	e.ready, e.readyAt, e.retries = nil, 0, nil
	e.held, e.bytes, e.probeBytes = 0, 0, 0
	e.p.stats.InFlight.Store(0)
}

// retryHeap orders aggregates waiting for a retry by due time.
type retryHeap []*aggQueue

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].retryAt.Before(h[j].retryAt) }
func (h retryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *retryHeap) Push(x any) {
	q := x.(*aggQueue)
	q.heapIdx = len(*h)
	*h = append(*h, q)
}
func (h *retryHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.heapIdx = -1
	return q
}

package pipeline

import (
	"container/heap"
	"context"
	"errors"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
)

// item is one event waiting in its aggregate's queue.
type item struct {
	ev          *event.Event
	batch       *batchState
	attempts    int
	firstFailed time.Time
	lastErr     error
}

// batchState tracks how many events of a captured batch are unsettled.
type batchState struct {
	batch   capture.Batch
	pending int
	outcome capture.Outcome
	archive archiveState
}

// aggQueue holds an aggregate's events in source order. Only its head is
// ever published, and only by one Publish call at a time.
type aggQueue struct {
	id      string
	items   []*item
	busy    bool      // the head is being published
	retryAt time.Time // the head waits for a retry until then
	queued  bool      // in the ready list
	heapIdx int
}

// result is the outcome of one Publish call.
type result struct {
	queues []*aggQueue
	err    error
}

// engine is the pipeline's state; it is owned by the goroutine running loop.
type engine struct {
	p        *Pipeline
	ctx      context.Context // publishes and archives; ends after the drain
	queues   map[string]*aggQueue
	ready    []*aggQueue
	retries  retryHeap
	held     int // events captured and not settled
	bytes    int // their payload bytes
	inFlight int
	results  chan result
	pause    time.Time // no publishes before this while the sink is unreachable
	outages  int       // consecutive unavailable results
	done     completer
	timer    *time.Timer
	parked   map[string]*park // see park.go
	received int              // batches received from the source
}

func newEngine(p *Pipeline, ctx context.Context) *engine {
	return &engine{
		p:       p,
		ctx:     ctx,
		queues:  make(map[string]*aggQueue),
		parked:  make(map[string]*park),
		results: make(chan result, p.opts.Concurrency),
		done:    completer{ctx: ctx, log: p.log, st: &p.stats},
		timer:   time.NewTimer(time.Hour),
	}
}

// loop runs until the drain after ctx's end finishes or the source fails.
// readDone is closed when the reader stopped; readErr then tells why.
func (e *engine) loop(ctx context.Context, batches <-chan capture.Batch, readDone <-chan struct{}, readErr func() error) error {
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
	for e.inFlight > 0 {
		<-e.results
		e.inFlight--
	}
	e.done.wg.Wait()
}

func (e *engine) add(b capture.Batch) {
	evs := b.Events()
	bs := &batchState{batch: b, pending: len(evs)}
	e.received++
	e.p.stats.Captured.Add(int64(len(evs)))
	e.held += len(evs)
	if len(evs) == 0 {
		e.done.complete(bs)
		return
	}
	for _, ev := range evs {
		e.bytes += len(ev.Payload)
		if e.parkedNow(ev.AggregateID) {
			e.leave(&item{ev: ev, batch: bs})
			continue
		}
		q := e.queues[ev.AggregateID]
		if q == nil {
			q = &aggQueue{id: ev.AggregateID, heapIdx: -1}
			e.queues[ev.AggregateID] = q
		}
		q.items = append(q.items, &item{ev: ev, batch: bs})
		e.markReady(q)
	}
	e.p.stats.InFlight.Store(int64(e.held))
}

func (e *engine) markReady(q *aggQueue) {
	if q.queued || q.busy || q.heapIdx >= 0 || len(q.items) == 0 {
		return
	}
	q.queued = true
	e.ready = append(e.ready, q)
}

// dispatch starts Publish calls while there is capacity and ready heads.
func (e *engine) dispatch() {
	if time.Now().Before(e.pause) {
		return
	}
	for e.inFlight < e.p.opts.Concurrency && len(e.ready) > 0 {
		n := min(len(e.ready), e.p.opts.BatchSize)
		qs := make([]*aggQueue, n)
		copy(qs, e.ready)
		e.ready = e.ready[n:]
		batch := make([]*event.Event, n)
		for i, q := range qs {
			q.queued, q.busy = false, true
			batch[i] = q.items[0].ev
		}
		e.inFlight++
		go func() {
			start := time.Now()
			err := e.p.snk.Publish(e.ctx, batch)
			e.p.opts.Metrics.publishDone(time.Since(start))
			e.results <- result{queues: qs, err: err}
		}()
	}
	if len(e.ready) == 0 {
		e.ready = nil // let the backing array go
	}
}

// settle applies the result of one Publish call.
func (e *engine) settle(r result) {
	e.inFlight--
	if e.ctx.Err() != nil {
		return // the drain timed out: loop abandons every unsettled batch
	}
	now := time.Now()
	anyOK, anyDown := false, false
	for i, q := range r.queues {
		q.busy = false
		err := sink.Failed(r.err, i)
		if err == nil {
			anyOK = true
			e.p.opts.Metrics.acked(q.items[0].ev, now)
			e.pop(q, nil, now)
			continue
		}
		it := q.items[0]
		it.lastErr = err
		class := sink.ClassOf(err)
		e.p.opts.Metrics.failed(class)
		switch {
		case class == sink.Unavailable:
			anyDown = true
			q.retryAt = now.Add(e.p.opts.Retry.unavailableDelay(e.outages + 1))
			heap.Push(&e.retries, q)
		case e.failed(it, class, now):
			e.pop(q, it, now)
		default:
			e.p.stats.Retries.Add(1)
			q.retryAt = now.Add(e.p.opts.Retry.delay(it.attempts))
			heap.Push(&e.retries, q)
		}
	}
	e.noteAvailability(anyOK, anyDown, r.err, now)
}

// failed counts a failed attempt of it and reports whether it is dead.
func (e *engine) failed(it *item, class sink.Class, now time.Time) bool {
	it.attempts++
	if it.firstFailed.IsZero() {
		it.firstFailed = now
	}
	dead := class == sink.Permanent || it.attempts >= e.p.opts.Retry.MaxAttempts
	lvl := e.p.log.Warn
	if dead {
		lvl = e.p.log.Error
	}
	lvl("publish failed", "message_id", it.ev.ID, "aggregate_id", it.ev.AggregateID,
		"attempt", it.attempts, "class", class.String(), "dead_letter", dead, "err", it.lastErr)
	return dead
}

func (e *engine) noteAvailability(anyOK, anyDown bool, err error, now time.Time) {
	switch {
	case anyDown && !anyOK:
		e.outages++
		wait := e.p.opts.Retry.unavailableDelay(e.outages)
		e.pause = now.Add(wait)
		if e.p.stats.Ready.Swap(false) || e.outages%10 == 0 {
			e.p.log.Warn("sink unreachable, waiting", "err", err, "retry_in", wait)
		}
	case anyOK:
		if !e.p.stats.Ready.Swap(true) {
			e.p.log.Info("sink reachable again")
		}
		e.outages = 0
	}
}

// pop settles the head of q: published when dead is nil, dead-lettered
// otherwise.
func (e *engine) pop(q *aggQueue, dead *item, now time.Time) {
	it := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	bs := it.batch
	if dead == nil {
		bs.outcome.Published = append(bs.outcome.Published, it.ev)
		e.p.stats.Published.Add(1)
	} else {
		bs.outcome.Dead = append(bs.outcome.Dead, capture.DeadEvent{
			Event: it.ev, Err: it.lastErr.Error(), Class: sink.ClassOf(it.lastErr).String(),
			Attempts: it.attempts, FirstFailed: it.firstFailed.UnixNano(), LastFailed: now.UnixNano(),
		})
		e.p.stats.DeadLettered.Add(1)
	}
	e.release(it)
	if bs.pending--; bs.pending == 0 {
		e.done.complete(bs)
	}
	if dead != nil && e.p.opts.ParkAggregate {
		e.parkAggregate(q, bs)
	}
	if len(q.items) == 0 {
		delete(e.queues, q.id)
		return
	}
	e.markReady(q)
}

// release counts it out of the window.
func (e *engine) release(it *item) {
	e.held--
	e.bytes -= len(it.ev.Payload)
	e.p.stats.InFlight.Store(int64(e.held))
}

// wake moves aggregates whose retry is due back to the ready list.
func (e *engine) wake(now time.Time) {
	for e.retries.Len() > 0 && !e.retries[0].retryAt.After(now) {
		q := heap.Pop(&e.retries).(*aggQueue)
		e.markReady(q)
	}
}

// armTimer sets the timer to the next retry or the end of the pause.
func (e *engine) armTimer() {
	next := time.Time{}
	if e.retries.Len() > 0 {
		next = e.retries[0].retryAt
	}
	if time.Now().Before(e.pause) && len(e.ready) > 0 && (next.IsZero() || e.pause.Before(next)) {
		next = e.pause
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
			if !seen[it.batch] {
				seen[it.batch] = true
				it.batch.batch.Abandon(context.WithoutCancel(e.ctx))
			}
		}
	}
	e.queues = map[string]*aggQueue{}
	e.ready, e.retries = nil, nil
	e.held, e.bytes = 0, 0
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

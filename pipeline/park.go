package pipeline

import (
	"slices"
	"strings"
	"sync/atomic"
)

// # Parking
//
// With Options.ParkAggregate, an aggregate whose event was dead-lettered
// publishes nothing more until the dead letter is redriven or dropped: its
// later events are left in the outbox (neither published nor dead), and the
// source stops capturing the aggregate once the dead letter is committed.
// Batches the source captured before that commit may still carry the
// aggregate's events, and so may batches captured before a batch holding an
// event the park left was completed (the source captures left events again
// only after that). So the park leaves the aggregate's events until a batch
// arrives that the source began to capture after every one of these
// completions: the reader notes how many batches were completed before it
// asks the source for the next one (see captured), so such a batch holds
// only events captured after the dead letter was committed (or failed to
// be) and after the left events were back in the outbox. The park then
// lifts, whether or not that batch carries events of the aggregate: a park
// keeps only the aggregate's key and the completions it waits for, never
// events, and lasts about two batches once those completions are done.

// park is the state of one parked aggregate: the completions it waits for,
// those of the batch holding the dead event and of each batch holding an
// event the park left.
type park struct {
	wait []*archiveState
}

// archiveState is a batch's completion, allocated apart from the batch so
// that a park waiting for it does not keep the batch's events alive.
type archiveState struct {
	// gen is the completion's number (see Pipeline.completed) once the
	// batch's Complete returned, successful or not; 0 before.
	gen atomic.Uint64
}

// seenBy reports whether a batch captured at gen was captured after this
// completion.
func (a *archiveState) seenBy(gen uint64) bool {
	g := a.gen.Load()
	return g != 0 && g <= gen
}

// parkAggregate leaves every queued event of q and parks its aggregate
// until the completion of dead, the batch holding its dead event.
func (e *engine) parkAggregate(q *aggQueue, dead *batchState) {
	p := e.parked[q.id]
	if p == nil {
		p = &park{}
		e.parked[strings.Clone(q.id)] = p // the key may share memory with the batch's events
	}
	p.wait = append(p.wait, dead.archive)
	for _, it := range q.items {
		e.leaveParked(p, it)
	}
	q.items = nil
}

// parkedNow reports whether it, of aggregate key and captured at gen, must
// be left, and leaves it then; otherwise it lifts the aggregate's park.
func (e *engine) parkedNow(key string, it *item, gen uint64) bool {
	p := e.parked[key]
	if p == nil {
		return false
	}
	if p.lifted(gen) {
		delete(e.parked, key)
		return false
	}
	e.leaveParked(p, it)
	return true
}

// leaveParked leaves it, of the aggregate parked by p, and makes p wait for
// the completion of its batch.
func (e *engine) leaveParked(p *park, it *item) {
	if n := len(p.wait); n == 0 || p.wait[n-1] != it.batch.archive {
		p.wait = append(p.wait, it.batch.archive)
	}
	e.leave(it)
}

// lifted forgets the completions a batch captured at gen was captured
// after, and reports whether none is left to wait for.
func (p *park) lifted(gen uint64) bool {
	p.wait = slices.DeleteFunc(p.wait, func(a *archiveState) bool { return a.seenBy(gen) })
	return len(p.wait) == 0
}

// sweep lifts the parks that a batch captured at gen lifts, so that a park
// ends whether or not its aggregate shows up again. It looks only when gen
// is newer than at its last look.
func (e *engine) sweep(gen uint64) {
	if gen == e.swept || len(e.parked) == 0 {
		return
	}
	e.swept = gen
	for key, p := range e.parked {
		if p.lifted(gen) {
			delete(e.parked, key)
		}
	}
}

// leave settles it as neither published nor dead: it stays in the outbox.
func (e *engine) leave(it *item) {
	e.release(it)
	bs := it.batch
	if bs.pending--; bs.pending == 0 {
		e.done.complete(bs)
	}
}

package pipeline

import (
	"slices"
	"strings"
	"sync/atomic"
)

// # Parking
//
// A parked aggregate publishes nothing: every event of it that reaches the
// engine is left in the outbox (settled as neither published nor dead) and
// captured again later. A park has up to three reasons, and lifts once none
// is left:
//
//   - a dead letter (Options.ParkAggregate): the source stops capturing an
//     aggregate that has one once it is committed, but batches captured
//     before that commit, or before a batch holding one of the aggregate's
//     left events was completed, may still carry its events. The park waits
//     for those completions (wait): it lifts at the first batch whose
//     capture began after all of them (see captureMark.gen), which holds only
//     events captured once the left ones were back in the outbox.
//   - a broken destination, with a capture.Holder source (dest, see
//     held.go): while it is set the aggregate is held in the source too.
//   - a release of that hold (before): the source's batches of the epoch
//     Release returned and later carry the aggregate's rows from its oldest
//     left row on, and earlier batches may carry any of them (the invariant
//     of capture.Holder), so the events of earlier batches are left. The
//     reader hands batches over in the order it captured them, so the park
//     lifts at the first batch of that epoch.
//
// A park keeps the aggregate's key and the completions it waits for, never
// events. A released aggregate's rows are thus captured once more after
// the release, plus once for those in flight when it was held.
type park struct {
	wait   []*archiveState // completions a dead-letter park waits for
	dead   bool            // parked by a dead letter: left events' completions are waited for
	dest   *destState      // the broken destination it is held in the outbox for, or nil
	before uint64          // after a release: events of batches of an earlier epoch are left
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

// parkOf returns the park of aggregate key, creating it.
func (e *engine) parkOf(key string) *park {
	p := e.parked[key]
	if p == nil {
		p = &park{}
		e.parked[strings.Clone(key)] = p // the key may share memory with the batch's events
	}
	return p
}

// parkAggregate leaves every queued event of q and parks its aggregate
// until the completion of dead, the batch holding its dead event.
func (e *engine) parkAggregate(q *aggQueue, dead *batchState) {
	p := e.parkOf(q.id)
	p.dead = true
	p.wait = append(p.wait, dead.archive)
	for _, it := range q.items {
		e.leaveParked(p, it)
	}
	q.items = nil
}

// parkedNow reports whether it, of aggregate key and in a batch c, must be
// left, and leaves it then; otherwise it lifts the aggregate's park.
func (e *engine) parkedNow(key string, it *item, c captured) bool {
	p := e.parked[key]
	if p == nil {
		return false
	}
	if p.lifted(c.at) {
		delete(e.parked, key)
		return false
	}
	e.leaveParked(p, it)
	return true
}

// leaveParked leaves it, of the aggregate parked by p; a dead-letter park
// then waits for the completion of its batch.
func (e *engine) leaveParked(p *park, it *item) {
	if n := len(p.wait); p.dead && (n == 0 || p.wait[n-1] != it.batch.archive) {
		p.wait = append(p.wait, it.batch.archive)
	}
	e.leave(it)
}

// lifted forgets the completions a batch captured at m was captured after,
// and reports whether the park has no reason left at m.
func (p *park) lifted(m captureMark) bool {
	p.wait = slices.DeleteFunc(p.wait, func(a *archiveState) bool { return a.seenBy(m.gen) })
	if len(p.wait) == 0 {
		p.dead = false
	}
	return len(p.wait) == 0 && p.dest == nil && m.epoch >= p.before
}

// sweep lifts the parks that a batch captured at m lifts, so that a park
// ends whether or not its aggregate shows up again. It looks only when m
// is newer than at its last look.
func (e *engine) sweep(m captureMark) {
	if m == e.swept || len(e.parked) == 0 {
		return
	}
	e.swept = m
	for key, p := range e.parked {
		if p.lifted(m) {
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

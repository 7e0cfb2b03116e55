package pipeline

import "sync/atomic"

// # Parking
//
// With Options.ParkAggregate, an aggregate whose event was dead-lettered
// publishes nothing more until the dead letter is redriven or dropped: its
// later events are left in the outbox (neither published nor dead), and the
// source stops capturing the aggregate once the dead letter is committed.
// Batches the source captured before that commit may still carry the
// aggregate's events, so the engine keeps leaving them until it has seen two
// more batches after noticing the commit: the source hands batches over one
// at a time, so the second one was captured after the commit.

// park is the state of one parked aggregate.
type park struct {
	dead  *batchState // the batch holding the dead event
	until int         // batches received before the park lifts; 0 until the dead letter is committed
}

// archiveState is set on a batch state once its Complete returned.
type archiveState struct {
	done   atomic.Bool
	failed atomic.Bool
}

// parkAggregate leaves every queued event of q and parks its aggregate.
func (e *engine) parkAggregate(q *aggQueue, dead *batchState) {
	e.parked[q.id] = &park{dead: dead}
	for _, it := range q.items {
		e.leave(it)
	}
	q.items = nil
}

// parkedNow reports whether events of aggregate id must be left, and lifts
// the park once the source can no longer hand over stale events.
func (e *engine) parkedNow(id string) bool {
	p := e.parked[id]
	if p == nil {
		return false
	}
	switch {
	case p.dead.archive.failed.Load():
		// The dead letter was not written: the events come again.
		delete(e.parked, id)
		return false
	case p.until == 0 && p.dead.archive.done.Load():
		p.until = e.received + 2
	case p.until != 0 && e.received >= p.until:
		delete(e.parked, id)
		return false
	}
	return true
}

// leave settles it as neither published nor dead: it stays in the outbox.
func (e *engine) leave(it *item) {
	e.release(it)
	bs := it.batch
	if bs.pending--; bs.pending == 0 {
		e.done.complete(bs)
	}
}

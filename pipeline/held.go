package pipeline

import (
	"slices"
	"strings"
	"time"
)

// # Holding in the outbox
//
// With a source that implements capture.Holder, a broken destination's
// events are not kept in memory: an aggregate whose head event is held is
// parked (see park.go) until the destination works again, and its events,
// those queued and those captured later, are left in the outbox, so their
// batches complete (in wal mode the slot moves on) and the window stays
// free for the other destinations. One copy of a held head event per
// destination stays in memory as its probe. When the probe succeeds (or
// sink.held_max_age expires), the source is asked to capture the held
// aggregates' rows again (Holder.Release), and their parks wait for the
// first batch the source began to capture after that, so their rows come
// back in source order, before any newer row of theirs. The probe's row is
// then published again with the same message_id.

// leaveHeld leaves q's events in the outbox and holds its aggregate there
// for d; q's head stays in memory, as a copy, when d has no probe yet (or
// q is its probe). It reports whether q is empty and gone.
func (e *engine) leaveHeld(d *destState, q *aggQueue) bool {
	if !e.mayHold(d, q.id) {
		return false
	}
	p := e.holdKey(d, q.id)
	keep := 0
	if d.probeQ == nil || d.probeQ == q {
		keep, d.probeQ = 1, q
	}
	for i, it := range q.items {
		switch {
		case it.batch == nil: // an earlier probe's copy: its row is in the outbox
		case i < keep:
			c := *it
			c.ev, c.batch = it.ev.Clone(), nil
			e.leaveParked(p, it)
			q.items[i] = &c
		default:
			e.leaveParked(p, it)
		}
	}
	clear(q.items[keep:])
	q.items = q.items[:keep]
	if keep == 0 {
		e.next(q)
		return true
	}
	return false
}

// maxHeldKeyBytes bounds the keys of the aggregates held in the outbox
// (their length plus heldKeyOverhead each), about 10,000 aggregates of
// short keys: the engine and the source keep them, and poll claims send
// them. Beyond it further aggregates are held in memory, in the window.
const maxHeldKeyBytes = 1 << 20

// heldKeyOverhead is what one held key counts besides its bytes.
const heldKeyOverhead = 64

// mayHold reports whether aggregate key may be held in the outbox for d:
// it already is, or the held keys have room for it.
func (e *engine) mayHold(d *destState, key string) bool {
	if p := e.parked[key]; p != nil && d.until != nil && slices.Contains(p.wait, d.until) {
		return true
	}
	return e.keyBytes+len(key)+heldKeyOverhead <= maxHeldKeyBytes
}

// holdKey parks aggregate key until d works again and tells the source,
// once per hold; it returns the park.
func (e *engine) holdKey(d *destState, key string) *park {
	if d.until == nil {
		d.until = new(archiveState)
	}
	p := e.parked[key]
	if p == nil {
		p = &park{}
		e.parked[strings.Clone(key)] = p // the key may share memory with the batch's events
	}
	if !slices.Contains(p.wait, d.until) {
		p.wait = append(p.wait, d.until)
		d.keys = append(d.keys, strings.Clone(key))
		e.keyBytes += len(key) + heldKeyOverhead
		e.holder.Hold(d.keys[len(d.keys)-1])
		e.p.stats.HeldAggregates.Add(1)
	}
	return p
}

// releaseKeys asks the source to capture the aggregates held in the
// outbox for d again, and lifts their parks once a batch captured after
// that arrives.
func (e *engine) releaseKeys(d *destState) {
	d.probeQ = nil
	if d.until == nil {
		return
	}
	e.holder.Release(d.keys)
	for _, k := range d.keys {
		e.keyBytes -= len(k) + heldKeyOverhead
	}
	e.p.stats.HeldAggregates.Add(-int64(len(d.keys)))
	d.until.gen.Store(e.p.completed.Add(1))
	d.keys, d.until = nil, nil
}

// dropProbe forgets q's head, a copy of a held event whose row is in the
// outbox, which failed other than by d being broken (destLevel false: the
// destination answered for the event, so it works) or after d expired.
// The release captures the row again, to be retried or dead-lettered from
// its batch.
func (e *engine) dropProbe(d *destState, q *aggQueue, destLevel bool, now time.Time) {
	q.items[0] = nil
	q.items = q.items[1:]
	if !destLevel && d.open {
		e.close(d, now)
	} else if d.probeQ == q {
		d.probeQ = nil
	}
	e.next(q)
}

package pipeline

import (
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
// free for the other destinations. A copy of the head event of up to
// maxProbes held aggregates per destination stays in memory as a probe
// candidate, within maxProbeBytes in all; probes rotate through them, so a
// probe that fails for its event's reason (a 400 for one event) is followed
// by another aggregate's, and one good event reopens the destination. A
// destination that gets no copy (the bytes are taken) holds its first
// aggregate in memory, in the window, as its probe. When a probe succeeds
// (or sink.held_max_age expires), the source is asked to capture the held
// aggregates' rows again (Holder.Release), and their parks leave the events
// of batches captured before the release, so their rows come back in
// source order, before any newer row of theirs. The probes' rows are then
// published again with the same message_id.

// maxProbes is how many held aggregates of one destination keep a copy of
// their head event in memory as probe candidates.
const maxProbes = 4

// leaveHeld leaves q's events in the outbox and holds its aggregate there
// for d; q's head stays in memory, as a copy, when it is a probe candidate
// (see maxProbes). It reports whether q is empty and gone; false means q
// is held in memory.
func (e *engine) leaveHeld(d *destState, q *aggQueue) bool {
	if !e.mayHold(d, q.id) {
		return false
	}
	keep := 0
	switch {
	case q.items[0].batch == nil: // already a candidate: an earlier probe's copy
		keep = 1
	case d.probes < maxProbes && e.probeBytes+q.items[0].ev.Size() <= e.maxProbeBytes():
		keep = 1
		d.probes++
		e.probeBytes += q.items[0].ev.Size()
	case d.probes == 0:
		return false // no room for a copy: q is the probe, in memory
	}
	p := e.holdKey(d, q.id)
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

// maxProbeBytes returns how many bytes (event.Event.Size) the probe
// candidates' copies may hold in all: a quarter of
// Options.MaxInFlightBytes.
func (e *engine) maxProbeBytes() int { return e.p.opts.MaxInFlightBytes / 4 }

// dropCopy forgets it, a probe candidate's copy leaving memory.
func (e *engine) dropCopy(it *item) {
	it.dest.probes--
	e.probeBytes -= it.ev.Size()
}

// maxHeldKeyBytes bounds the keys of the aggregates held in the outbox
// (their length plus heldKeyOverhead each), about 2,500 aggregates of
// short keys: the engine and the source keep them, and each poll claim
// sends them. Beyond it further aggregates are held in memory, in the
// window.
const maxHeldKeyBytes = 256 << 10

// heldKeyOverhead is what one held key counts besides its bytes.
const heldKeyOverhead = 64

// mayHold reports whether aggregate key may be held in the outbox for d:
// it already is, or the held keys have room for it.
func (e *engine) mayHold(d *destState, key string) bool {
	if p := e.parked[key]; p != nil && p.dest == d {
		return true
	}
	return e.keyBytes+len(key)+heldKeyOverhead <= maxHeldKeyBytes
}

// holdKey parks aggregate key until d works again and tells the source,
// once per hold; it returns the park. A key held for another destination
// stays held for that one: its events are left until that one works.
func (e *engine) holdKey(d *destState, key string) *park {
	p := e.parkOf(key)
	if p.dest == nil {
		p.dest = d
		d.keys = append(d.keys, strings.Clone(key))
		e.keyBytes += len(key) + heldKeyOverhead
		e.holder.Hold(d.keys[len(d.keys)-1])
		e.p.stats.HeldAggregates.Add(1)
	}
	return p
}

// releaseKeys asks the source to capture the aggregates held in the
// outbox for d again; their parks leave the events of the batches captured
// before that.
func (e *engine) releaseKeys(d *destState) {
	if len(d.keys) == 0 {
		return
	}
	epoch := e.holder.Release(d.keys)
	for _, k := range d.keys {
		e.keyBytes -= len(k) + heldKeyOverhead
		if p := e.parked[k]; p != nil && p.dest == d {
			p.dest, p.before = nil, max(p.before, epoch)
		}
	}
	e.p.stats.HeldAggregates.Add(-int64(len(d.keys)))
	d.keys = nil
}

// dropProbe forgets q's head, a copy of a held event whose row is in the
// outbox, which failed other than by d being broken (destLevel false: the
// destination answered for the event, so it works) or after d expired.
// The release captures the row again, to be retried or dead-lettered from
// its batch.
func (e *engine) dropProbe(d *destState, q *aggQueue, destLevel bool, now time.Time) {
	e.dropCopy(q.items[0])
	q.items[0] = nil
	q.items = q.items[1:]
	if !destLevel && d.open {
		e.close(d, now)
	}
	e.next(q)
}

package pipeline

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
)

// # Destinations
//
// Every event is routed to a destination (sink.Destinations.DestinationOf;
// sink.Broker for a sink that names none), and each destination has a
// circuit breaker. A failure of the destination opens it: a fault.Unavailable
// failure, or a suspect one (fault.AsSuspect) while the destination has not
// acknowledged anything since it last broke, was never reached, or failed
// suspectStreak distinct events in a row. While it is open, the
// destination's aggregates are held, nothing counts as an attempt and
// nothing is dead-lettered; one held head event at a time is sent as a
// probe, with capped backoff, rotating through the held aggregates. The
// first acknowledgement closes it and releases the held aggregates in the
// order they were held. Other destinations go on.
//
// While a destination has no events, the sink's Probe checks it every
// Options.ProbeInterval, so a dead broker is reported with an idle outbox.
//
// With Options.HeldMaxAge, a destination broken that long expires: its
// held aggregates are released and its events are sent as they come, each
// failure of the destination dead-letters the event with the reason, and
// the first acknowledgement closes the breaker.

// suspectStreak is how many distinct events failing with suspect errors in a
// row, with no acknowledgement in between, make the destination broken.
const suspectStreak = 3

// keptIdle is how many idle destinations are remembered for idle probes.
const keptIdle = 16

// destState is one destination's breaker; the engine goroutine owns it.
type destState struct {
	name      string
	open      bool
	since     time.Time   // when the breaker opened
	failures  int         // failed probes since it opened
	probeAt   time.Time   // next probe with a held event
	probing   bool        // a held event is being sent as a probe
	expired   bool        // open longer than Options.HeldMaxAge: nothing is held
	idleProbe bool        // a sink probe is running
	waiting   []*aggQueue // held aggregates, in the order they were held
	streak    int         // distinct events with suspect failures since the last success
	gen       int         // bumped on each success; an item's streak mark holds for one gen
	events    int         // queued events routed here
	lastUsed  time.Time   // last event routed here or publish result
	lastOK    time.Time   // last acknowledgement or successful probe; zero: none yet
	lastErr   error
	okIn      uint64 // the engine's settles count when a Publish result last had an ack from here
	// With a capture.Holder source (see held.go): the aggregates held in
	// the outbox for this destination, and how many held aggregates keep a
	// copy of their head event in memory as probe candidates.
	keys   []string
	probes int
}

// DestinationStatus is the state of one destination's breaker.
type DestinationStatus struct {
	// Name is the destination as the sink names it.
	Name string
	// Since is when the breaker opened.
	Since time.Time
	// Err is the failure that opened it.
	Err string
}

// probeResult is the outcome of one idle probe.
type probeResult struct {
	dest string
	err  error
}

// route returns the destination state of ev, creating it when new.
func (e *engine) route(ev *event.Event, now time.Time) *destState {
	name := sink.Broker
	if e.router != nil {
		name = e.router.DestinationOf(ev)
	}
	d := e.dests[name]
	if d == nil {
		d = &destState{name: name}
		e.dests[name] = d
	}
	d.lastUsed = now
	return d
}

// destLevel reports whether err, a failure of it's publish to d, is a
// failure of d rather than of the event. okIn is whether the same Publish
// call had an event acknowledged by d.
func (e *engine) destLevel(d *destState, it *item, err error, okIn bool) bool {
	if fault.ClassOf(err) == fault.Unavailable {
		return true
	}
	if !fault.IsSuspect(err) || okIn {
		return false
	}
	return d.open || d.lastOK.IsZero() || d.streak >= suspectStreak
}

// suspected counts it's suspect failure in its destination's streak, once
// per event between two successes.
func (e *engine) suspected(it *item) {
	if d := it.dest; it.streakGen != d.gen+1 {
		it.streakGen = d.gen + 1
		d.streak++
	}
}

// trip opens d's breaker after a destination-level failure, or pushes its
// next probe back after a failed one.
func (e *engine) trip(d *destState, err error, probe bool, now time.Time) {
	d.lastErr = err
	if d.open {
		if probe {
			d.failures++
			d.probeAt = now.Add(e.p.opts.Retry.unavailableDelay(d.failures))
		}
		return
	}
	d.open, d.since, d.failures = true, now, 1
	d.probeAt = now.Add(e.p.opts.Retry.unavailableDelay(1))
	e.broken++
	e.p.log.Warn("destination unreachable: holding its events and probing until it works",
		"destination", rowtext.Value(d.name), "err", rowtext.Error(err.Error()))
	e.publishStatus()
}

// ok notes that d acknowledged an event or passed a probe, and closes its
// breaker when probe is set: an event sent before the breaker opened and
// acknowledged after does not close it.
func (e *engine) ok(d *destState, probe bool, now time.Time) {
	first := d.lastOK.IsZero()
	d.lastOK, d.streak = now, 0
	d.gen++
	if first && e.broken > 0 && e.chosen(d) {
		e.publishStatus() // a row-chosen destination works: see publishStatus
	}
	if !d.open || !(probe || d.expired) {
		return
	}
	e.close(d, now)
}

// close closes d's breaker: its held aggregates are released in the order
// they were held.
func (e *engine) close(d *destState, now time.Time) {
	d.open, d.expired = false, false
	e.broken--
	e.p.log.Info("destination reachable again: resuming", "destination", rowtext.Value(d.name),
		"broken_for", now.Sub(d.since).Round(time.Millisecond), "held_aggregates", len(d.waiting)+len(d.keys))
	e.unhold(d)
	e.publishStatus()
}

// unhold releases d's held aggregates: those in memory are marked ready,
// those in the outbox are captured again.
func (e *engine) unhold(d *destState) {
	for _, q := range d.waiting {
		q.held = false
		e.markReady(q)
	}
	d.waiting = nil
	e.releaseKeys(d)
}

// hold keeps q back until d's breaker closes or q's turn to probe comes:
// in memory, or with a capture.Holder source in the outbox (see held.go).
func (e *engine) hold(d *destState, q *aggQueue) {
	if e.holder != nil && e.leaveHeld(d, q) {
		return
	}
	q.held = true
	d.waiting = append(d.waiting, q)
}

// dueProbes expires the destinations broken for Options.HeldMaxAge and
// sends one held aggregate's head event to each broken destination whose
// probe is due.
func (e *engine) dueProbes(now time.Time) {
	if e.broken == 0 {
		return
	}
	e.expire(now)
	for _, d := range e.dests {
		if !d.open || d.probing || len(d.waiting) == 0 || now.Before(d.probeAt) {
			continue
		}
		q := d.waiting[0]
		d.waiting[0] = nil
		d.waiting = d.waiting[1:]
		q.held, q.probe, d.probing = false, true, true
		e.markReady(q)
	}
}

// expire releases the held aggregates of every destination broken for
// Options.HeldMaxAge: their events are sent, and dead-lettered while the
// destination still fails.
func (e *engine) expire(now time.Time) {
	limit := e.p.opts.HeldMaxAge
	if limit <= 0 {
		return
	}
	for _, d := range e.dests {
		if !d.open || d.expired || now.Sub(d.since) < limit {
			continue
		}
		d.expired = true
		e.p.log.Error("destination broken longer than sink.held_max_age: dead-lettering its held events, and those routed to it until it works",
			"destination", d.name, "broken_for", now.Sub(d.since).Round(time.Millisecond),
			"held_aggregates", len(d.waiting)+len(d.keys), "err", d.lastErr)
		e.unhold(d)
	}
}

// nextProbe returns when the next held-event probe or expiry is due, or
// zero.
func (e *engine) nextProbe() time.Time {
	var next time.Time
	if e.broken == 0 {
		return next
	}
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, d := range e.dests {
		if d.open && !d.probing && len(d.waiting) > 0 {
			earlier(d.probeAt)
		}
		if d.open && !d.expired && e.p.opts.HeldMaxAge > 0 {
			earlier(d.since.Add(e.p.opts.HeldMaxAge))
		}
	}
	return next
}

// idleProbes starts a sink probe of every destination with no events, and
// forgets idle destinations beyond keptIdle.
func (e *engine) idleProbes(now time.Time) {
	e.nextIdle = now.Add(e.p.opts.ProbeInterval)
	if e.router == nil {
		return
	}
	if e.dests[sink.Broker] == nil {
		e.dests[sink.Broker] = &destState{name: sink.Broker, lastUsed: now}
	}
	var idle []*destState
	for _, d := range e.dests {
		if d.events == 0 && !d.probing && !d.idleProbe && len(d.waiting) == 0 {
			idle = append(idle, d)
		}
	}
	slices.SortFunc(idle, func(a, b *destState) int { return b.lastUsed.Compare(a.lastUsed) })
	kept, forgot := 0, false
	for _, d := range idle {
		if !d.open && d.name != sink.Broker {
			if kept++; kept > keptIdle {
				delete(e.dests, d.name)
				forgot = true
				continue
			}
		}
		d.idleProbe = true
		e.probesOut++
		go func(name string) {
			ctx, cancel := context.WithTimeout(e.ctx, e.p.opts.ProbeInterval)
			err := e.router.Probe(ctx, name)
			cancel()
			e.probes <- probeResult{dest: name, err: err}
		}(d.name)
	}
	if forgot && e.broken > 0 {
		e.publishStatus()
	}
}

// probed applies an idle probe's result: a failure opens the breaker, a
// success closes one that holds no events.
func (e *engine) probed(r probeResult, now time.Time) {
	e.probesOut--
	d := e.dests[r.dest]
	if d == nil || e.ctx.Err() != nil {
		return
	}
	d.idleProbe = false
	switch {
	case errors.Is(r.err, sink.ErrNoProbe):
	case r.err == nil:
		if len(d.waiting) == 0 && !d.probing {
			e.ok(d, true, now)
		}
	case d.events == 0:
		e.trip(d, r.err, false, now)
	}
}

// chosen reports whether row values chose d (see sink.RowRouted).
func (e *engine) chosen(d *destState) bool { return e.rowChosen && d.name != sink.Broker }

// publishStatus updates what Ready and Destinations report. Every broken
// destination is reported, but a broken one that row values chose makes
// the relay not ready only while no row-chosen destination it knows has
// worked and is not broken: then the receiver or broker as a whole is the
// likely fault, not one row's route. Broker and fixed destinations make it
// not ready whenever they are broken.
func (e *engine) publishStatus() {
	var list []DestinationStatus
	fixedBroken, chosenBroken, chosenWorking := 0, 0, 0
	for _, d := range e.dests {
		switch {
		case d.open && e.chosen(d):
			chosenBroken++
		case d.open:
			fixedBroken++
		case e.chosen(d) && !d.lastOK.IsZero():
			chosenWorking++
		}
		if d.open {
			list = append(list, DestinationStatus{Name: d.name, Since: d.since, Err: errString(d.lastErr)})
		}
	}
	e.p.stats.Ready.Store(fixedBroken == 0 && (chosenBroken == 0 || chosenWorking > 0))
	e.p.stats.Broken.Store(int64(e.broken))
	slices.SortFunc(list, func(a, b DestinationStatus) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Name, b.Name))
	})
	if len(list) > MaxLabelValues {
		list = list[:MaxLabelValues]
	}
	e.p.broken.Store(&list)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

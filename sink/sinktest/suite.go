package sinktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/template"
)

// Guards against hangs. None of them is a performance expectation: a correct
// sink on a local broker finishes each step in a small fraction of them.
const (
	// publishGuard bounds one Publish call that should succeed.
	publishGuard = 30 * time.Second
	// defaultDeliveryTimeout is the default of Harness.DeliveryTimeout.
	defaultDeliveryTimeout = 15 * time.Second
	// returnGuard bounds how long Publish may take to return after its
	// context ended.
	returnGuard = 5 * time.Second
	// driveGuard bounds publishing a whole event set with retries.
	driveGuard = 60 * time.Second
)

// maxErrors caps the errors one check reports, so that a sink that gets
// everything wrong fails readably.
const maxErrors = 15

type suite struct {
	h    Harness
	root string // the test name Run was called with
}

// run runs fn as the subtest name of t, unless Harness.Skip names it or one
// of its parents.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	if s.root == "" {
		s.root = t.Name()
	}
	t.Run(name, func(t *testing.T) {
		path := strings.TrimPrefix(t.Name(), s.root+"/")
		for p := path; p != ""; {
			if reason, ok := s.h.Skip[p]; ok {
				t.Skipf("skipped by the harness: %s", reason)
			}
			i := strings.LastIndexByte(p, '/')
			if i < 0 {
				break
			}
			p = p[:i]
		}
		fn(t)
	})
}

// skipped reports whether the harness skips the subtest path.
func (s *suite) skipped(path string) bool {
	_, ok := s.h.Skip[path]
	return ok
}

// newScope returns a scope for one subtest: tag and 8 random hex digits,
// short enough for SQS queue names and made only of [a-z0-9-].
func newScope(tag string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return tag + "-" + hex.EncodeToString(b)
}

func (s *suite) template(scope, suffix string) string {
	if s.h.Template != nil {
		return s.h.Template(scope, suffix)
	}
	return scope + "." + suffix
}

// target is a sink under test with the scope it publishes under.
type target struct {
	scope string
	tmpl  string
	exp   template.Template // renders the destination each event must arrive at
	snk   sink.Sink
}

// newTarget creates a sink for a new scope, with the template built from
// suffix. The sink is closed when the test ends.
func (s *suite) newTarget(t *testing.T, tag, suffix string) *target {
	t.Helper()
	scope := newScope(tag)
	tmpl := s.template(scope, suffix)
	exp, err := template.Parse(tmpl, s.h.Sanitize)
	if err != nil {
		t.Fatalf("sinktest: Harness.Template(%q, %q) = %q: %v", scope, suffix, tmpl, err)
	}
	return &target{scope: scope, tmpl: tmpl, exp: exp, snk: s.newSink(t, scope, tmpl)}
}

// newSink calls Harness.New and closes the sink when the test ends.
func (s *suite) newSink(t *testing.T, scope, tmpl string) sink.Sink {
	t.Helper()
	snk := s.h.New(t, scope, tmpl)
	if snk == nil {
		t.Fatal("sinktest: Harness.New returned nil")
	}
	t.Cleanup(func() { snk.Close() })
	return snk
}

// newEvent returns an event with a fresh random ID and a JSON payload.
func newEvent(aggType, aggID, evType string) *event.Event {
	id := uuid.NewString()
	return &event.Event{
		ID:            id,
		AggregateType: aggType,
		AggregateID:   aggID,
		EventType:     evType,
		Payload:       fmt.Appendf(nil, `{"id":%q,"aggregate":%q}`, id, aggID),
		ContentType:   event.ContentTypeJSON,
		CreatedAt:     time.Now().UTC(),
	}
}

// publish publishes batch in one call and returns its error, failing the
// test when Publish does not return within publishGuard.
func publish(t *testing.T, snk sink.Sink, batch []*event.Event) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishGuard)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- snk.Publish(ctx, batch) }()
	select {
	case err := <-done:
		return err
	case <-time.After(publishGuard + returnGuard):
		t.Fatalf("Publish of %d events did not return %v after its %v deadline", len(batch), returnGuard, publishGuard)
		return nil
	}
}

// mustPublish publishes batch and fails the test unless every event was
// acknowledged.
func mustPublish(t *testing.T, snk sink.Sink, batch []*event.Event) {
	t.Helper()
	if err := publish(t, snk, batch); err != nil {
		t.Fatalf("Publish of %d events: %v (classes %v)", len(batch), err, classes(err, len(batch)))
	}
}

// classes returns the class of each event's error in a Publish result, or
// "ok", compressed into runs for readable messages.
func classes(err error, n int) string {
	var b strings.Builder
	prev, run := "", 0
	flush := func() {
		if run > 0 {
			if b.Len() > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%s×%d", prev, run)
		}
	}
	for i := range n {
		c := "ok"
		if f := sink.Failed(err, i); f != nil {
			c = fault.ClassOf(f).String()
		}
		if c != prev {
			flush()
			prev, run = c, 0
		}
		run++
	}
	flush()
	return "[" + b.String() + "]"
}

// reporter collects the errors of one check, up to maxErrors.
type reporter struct {
	t *testing.T
	n int
}

func (r *reporter) errorf(format string, args ...any) {
	r.t.Helper()
	r.n++
	switch {
	case r.n < maxErrors:
		r.t.Errorf(format, args...)
	case r.n == maxErrors:
		r.t.Errorf(format+" (further errors of this check not shown)", args...)
	}
}

// values returns the values of header name in m, comparing names as the
// features say.
func (s *suite) values(m Message, name string) []string {
	if !s.h.Features.CaseInsensitiveHeaders {
		return m.Headers[name]
	}
	var out []string
	for k, v := range m.Headers {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return out
}

// messageID returns the message's first message_id header, or "".
func (s *suite) messageID(m Message) string {
	if v := s.values(m, "message_id"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// byID groups msgs by their message_id header.
func (s *suite) byID(msgs []Message) map[string][]Message {
	out := make(map[string][]Message, len(msgs))
	for _, m := range msgs {
		id := s.messageID(m)
		out[id] = append(out[id], m)
	}
	return out
}

// await polls Received for scope until every event of want has at least one
// copy, or Harness.DeliveryTimeout passes, and returns what it received
// last. It never fails the test itself: the checks on the result do.
func (s *suite) await(t *testing.T, scope string, want []*event.Event) []Message {
	t.Helper()
	timeout := s.h.DeliveryTimeout
	if timeout <= 0 {
		timeout = defaultDeliveryTimeout
	}
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		msgs := s.h.Received(t, scope)
		ids := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			ids[s.messageID(m)] = true
		}
		missing := 0
		for _, e := range want {
			if !ids[e.ID] {
				missing++
			}
		}
		if missing == 0 {
			return msgs
		}
		if time.Now().After(deadline) {
			t.Logf("after %v, %d of %d acknowledged events are still not in Received", timeout, missing, len(want))
			return msgs
		}
		time.Sleep(wait)
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// one checks that values holds exactly want.
func one(r *reporter, e *event.Event, name string, values []string, want string) {
	r.t.Helper()
	switch {
	case len(values) == 0:
		r.errorf("event %s: header %s missing, want %q", e.ID, name, want)
	case len(values) > 1:
		r.errorf("event %s: header %s sent %d times %q, want once %q", e.ID, name, len(values), values, want)
	case values[0] != want:
		r.errorf("event %s: header %s = %q, want %q", e.ID, name, values[0], want)
	}
}

// checkID checks message_id and the ID headers of one copy of e.
func (s *suite) checkID(r *reporter, e *event.Event, m Message) {
	r.t.Helper()
	one(r, e, "message_id", s.values(m, "message_id"), e.ID)
	for _, name := range s.h.Features.IDHeaders {
		one(r, e, name, s.values(m, name), e.ID)
	}
}

// checkContract checks the destination, the contract headers other than the
// IDs, the ordering key and the content type of one copy of e.
func (s *suite) checkContract(r *reporter, tg *target, e *event.Event, m Message) {
	r.t.Helper()
	s.checkRouting(r, tg, e, m)
	one(r, e, "event_type", s.values(m, "event_type"), e.EventType)
	one(r, e, "aggregate_type", s.values(m, "aggregate_type"), e.AggregateType)
	one(r, e, "aggregate_id", s.values(m, "aggregate_id"), e.AggregateID)
	if name := s.h.Features.ContentTypeHeader; name != "" {
		one(r, e, name, s.values(m, name), e.ContentType)
	}
}

// checkRouting checks the destination and the ordering key of one copy of
// e.
func (s *suite) checkRouting(r *reporter, tg *target, e *event.Event, m Message) {
	r.t.Helper()
	if want := tg.exp.Render(e); m.Destination != want {
		r.errorf("event %s: arrived at %q, want %q (template %q)", e.ID, m.Destination, want, tg.tmpl)
	}
	if s.h.Features.KeyedByAggregate && m.Key != e.Key() {
		r.errorf("event %s: ordering key %q, want the event's key %q", e.ID, m.Key, e.Key())
	}
}

// reserved reports whether name is a header the sink itself sets.
func (s *suite) reserved(name string) bool {
	names := append([]string{"message_id", "event_type", "aggregate_type", "aggregate_id", s.h.Features.ContentTypeHeader}, s.h.Features.IDHeaders...)
	for _, n := range names {
		if n == name || s.h.Features.CaseInsensitiveHeaders && strings.EqualFold(n, name) {
			return true
		}
	}
	return false
}

// checkRow checks that the row headers of e arrived on one copy of it.
func (s *suite) checkRow(r *reporter, e *event.Event, m Message) {
	r.t.Helper()
	for k, v := range e.Headers {
		if !s.reserved(k) {
			one(r, e, k, s.values(m, k), v)
		}
	}
}

func checkPayload(r *reporter, e *event.Event, m Message) {
	r.t.Helper()
	if !bytes.Equal(m.Payload, e.Payload) {
		r.errorf("event %s: payload of %d bytes %s, want %d bytes %s", e.ID, len(m.Payload), excerpt(m.Payload), len(e.Payload), excerpt(e.Payload))
	}
}

func excerpt(b []byte) string {
	if len(b) > 48 {
		return fmt.Sprintf("%q…", b[:48])
	}
	return fmt.Sprintf("%q", b)
}

// expect tunes checkDelivered.
type expect struct {
	// exactlyOnce requires a single copy of each event when the broker
	// deduplicates (Features.DedupesByID).
	exactlyOnce bool
	// mayAppear lists events that failed but may have reached the broker
	// before they did: their copies are not unexpected.
	mayAppear []*event.Event
	// routingOnly checks the IDs, destination, ordering key and payload,
	// not the other header values (for events whose values are chosen to
	// test destinations, not headers).
	routingOnly bool
}

// checkDelivered checks every copy of every event of want in msgs (IDs,
// contract headers, row headers, payload), that each event arrived, and
// that msgs holds nothing else. It returns the copies by message_id.
func (s *suite) checkDelivered(t *testing.T, tg *target, want []*event.Event, msgs []Message, x expect) map[string][]Message {
	t.Helper()
	r := &reporter{t: t}
	got := s.byID(msgs)
	known := make(map[string]bool, len(want))
	for _, e := range want {
		known[e.ID] = true
		copies := got[e.ID]
		if len(copies) == 0 {
			r.errorf("event %s (aggregate %q) was acknowledged but never arrived", e.ID, e.AggregateID)
			continue
		}
		if x.exactlyOnce && s.h.Features.DedupesByID && len(copies) != 1 {
			r.errorf("event %s arrived %d times; the broker deduplicates by message ID (Features.DedupesByID), want once", e.ID, len(copies))
		}
		for _, m := range copies {
			s.checkID(r, e, m)
			if x.routingOnly {
				s.checkRouting(r, tg, e, m)
			} else {
				s.checkContract(r, tg, e, m)
				s.checkRow(r, e, m)
			}
			checkPayload(r, e, m)
		}
	}
	for _, e := range x.mayAppear {
		known[e.ID] = true
	}
	for id, copies := range got {
		if !known[id] {
			r.errorf("%d unexpected message(s) with message_id %q at %q", len(copies), id, copies[0].Destination)
		}
	}
	return got
}

// checkOrder checks that, for each aggregate, the first delivery of each of
// its events in msgs follows the order of events (which lists each
// aggregate's events in publish order). Later copies are ignored: a
// redelivery may repeat an earlier event. Events that never arrived are
// left out (checkDelivered reports them), so a loss is not also reported
// as disorder.
func (s *suite) checkOrder(t *testing.T, events []*event.Event, msgs []Message) {
	t.Helper()
	if s.h.Features.Unordered {
		t.Log("Features.Unordered: per-aggregate order not checked")
		return
	}
	arrived := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		arrived[s.messageID(m)] = true
	}
	type pos struct {
		agg string
		n   int
	}
	where := make(map[string]pos, len(events))
	count := map[string]int{}
	for _, e := range events {
		if arrived[e.ID] {
			where[e.ID] = pos{e.Key(), count[e.Key()]}
			count[e.Key()]++
		}
	}
	r := &reporter{t: t}
	next := map[string]int{}
	broken := map[string]bool{}
	seen := make(map[string]bool, len(events))
	for _, m := range msgs {
		id := s.messageID(m)
		p, ok := where[id]
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		if p.n != next[p.agg] && !broken[p.agg] {
			broken[p.agg] = true
			r.errorf("aggregate %s: its event #%d (%s) was delivered first when #%d was due", p.agg, p.n, id, next[p.agg])
		}
		next[p.agg] = max(next[p.agg], p.n+1)
	}
}

// spreadEvents returns n events over aggregates aggregates, interleaved:
// event i belongs to aggregate i%aggregates, whose aggregate type is one of
// three. Each aggregate's events appear in the slice in their order.
func spreadEvents(n, aggregates int) []*event.Event {
	types := []string{"alpha", "beta", "gamma"}
	out := make([]*event.Event, n)
	for i := range out {
		a := i % aggregates
		e := newEvent(types[a%len(types)], fmt.Sprintf("agg-%04d", a), "step")
		e.Payload = fmt.Appendf(nil, `{"aggregate":%d,"seq":%d}`, a, i/aggregates)
		out[i] = e
	}
	return out
}

// checkNotPermanent fails the test for each event of a Publish result whose
// error is classified fault.Permanent.
func checkNotPermanent(t *testing.T, when string, err error, batch []*event.Event) {
	t.Helper()
	r := &reporter{t: t}
	for i, e := range batch {
		if f := sink.Failed(err, i); f != nil && fault.ClassOf(f) == fault.Permanent {
			r.errorf("%s: event %s failed as permanent, so the relay would dead-letter it; want unavailable or transient: %v", when, e.ID, f)
		}
	}
}

// acked returns the events of batch that a Publish result reports as
// acknowledged, and those that failed.
func acked(err error, batch []*event.Event) (ok, failed []*event.Event) {
	for i, e := range batch {
		if sink.Failed(err, i) == nil {
			ok = append(ok, e)
		} else {
			failed = append(failed, e)
		}
	}
	return ok, failed
}

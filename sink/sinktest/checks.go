package sinktest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// publishedSet is a batch published in one call, with each event's result,
// checked by several subtests.
type publishedSet struct {
	tg   *target
	msgs map[string][]Message // copies by message_id
	errs map[string]error     // publish error by event ID; nil when acknowledged
}

// publishSet publishes batch in one call and waits for the acknowledged
// events to arrive. Failed events are recorded, not fatal, so each subtest
// reports only the events it is about.
func (s *suite) publishSet(t *testing.T, tg *target, batch []*event.Event) *publishedSet {
	t.Helper()
	err := publish(t, tg.snk, batch)
	ok, _ := acked(err, batch)
	ps := &publishedSet{tg: tg, errs: map[string]error{}}
	for i, e := range batch {
		ps.errs[e.ID] = sink.Failed(err, i)
	}
	ps.msgs = s.byID(s.await(t, tg.scope, ok))
	return ps
}

// copies returns the copies of e, failing the test when e was not
// acknowledged or never arrived.
func (ps *publishedSet) copies(t *testing.T, e *event.Event) []Message {
	t.Helper()
	if err := ps.errs[e.ID]; err != nil {
		t.Errorf("event %s (%s) was not acknowledged: %v (class %v)", e.ID, e.EventType, err, fault.ClassOf(err))
		return nil
	}
	c := ps.msgs[e.ID]
	if len(c) == 0 {
		t.Errorf("event %s (%s) was acknowledged but never arrived", e.ID, e.EventType)
	}
	return c
}

func (s *suite) testHeaders(t *testing.T) {
	tg := s.newTarget(t, "hdr", "{aggregate_type}")
	plain := newEvent("order", "o-1", "order.created")
	nilHeaders := newEvent("order", "o-2", "order.paid")
	emptyHeaders := newEvent("invoice", "i-1", "invoice.sent")
	emptyHeaders.Headers = map[string]string{}
	row := newEvent("invoice", "i-2", "invoice.voided")
	row.OrderKey = "tenant-7" // outbox.order_by: the key is not the aggregate id
	row.Headers = map[string]string{
		"trace_id":     "4bf92f3577b34da6a3ce929d0e0e4736",
		"tenant":       "acme corp",
		"x-request-id": "k=v; a,b:c/d?e",
		"origin":       "ünïcødé ✓",
	}
	spoof := newEvent("order", "o-3", "order.shipped")
	spoof.Headers = map[string]string{
		"message_id":     "00000000-0000-0000-0000-000000000000",
		"event_type":     "spoofed",
		"aggregate_type": "spoofed",
		"aggregate_id":   "spoofed",
		"trace_id":       "t-3",
	}
	plain.Headers = map[string]string{"trace_id": "t-1"}
	traced := newEvent("order", "o-4", "order.refunded")
	traced.Headers = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
	}
	for i := range 8 { // more headers than SQS has attributes left
		traced.Headers[fmt.Sprint("h", i)] = fmt.Sprint(i)
	}
	all := []*event.Event{plain, nilHeaders, emptyHeaders, row, spoof, traced}
	ps := s.publishSet(t, tg, all)

	s.run(t, "message_id", func(t *testing.T) {
		r := &reporter{t: t}
		for _, e := range all {
			for _, m := range ps.copies(t, e) {
				s.checkID(r, e, m)
				if s.h.Inspect != nil {
					s.h.Inspect(t, e, m)
				}
			}
		}
	})
	s.run(t, "contract", func(t *testing.T) {
		r := &reporter{t: t}
		for _, e := range all {
			for _, m := range ps.copies(t, e) {
				s.checkContract(r, tg, e, m)
			}
		}
	})
	s.run(t, "row", func(t *testing.T) {
		r := &reporter{t: t}
		for _, e := range []*event.Event{plain, nilHeaders, emptyHeaders, row, traced} {
			for _, m := range ps.copies(t, e) {
				s.checkRow(r, e, m)
			}
		}
	})
	s.run(t, "trace_context", func(t *testing.T) {
		r := &reporter{t: t}
		for _, m := range ps.copies(t, traced) {
			for _, k := range []string{"traceparent", "tracestate"} {
				one(r, traced, k, s.values(m, k), traced.Headers[k])
			}
		}
	})
	s.run(t, "reserved", func(t *testing.T) {
		r := &reporter{t: t}
		for _, m := range ps.copies(t, spoof) {
			s.checkID(r, spoof, m)
			s.checkContract(r, tg, spoof, m)
			s.checkRow(r, spoof, m)
		}
		if c := ps.msgs[spoof.Headers["message_id"]]; len(c) > 0 {
			t.Errorf("a message arrived with the message_id %q of a row header, want the event ID %s", spoof.Headers["message_id"], spoof.ID)
		}
	})
	s.run(t, "dropped", func(t *testing.T) {
		e := newEvent("order", "o-5", "order.spoofed")
		e.Headers = droppedHeaders(s.h.Features.Control)
		ps := s.publishSet(t, tg, []*event.Event{e})
		r := &reporter{t: t}
		for _, m := range ps.copies(t, e) {
			s.checkID(r, e, m)
			s.checkContract(r, tg, e, m)
			one(r, e, "kept", s.values(m, "kept"), "k")
			for k, vs := range m.Headers {
				for _, v := range vs {
					if strings.HasPrefix(v, "spoof-") {
						r.errorf("event %s: the row header %s: %q was forwarded", e.ID, k, v)
					}
				}
			}
		}
	})
	s.run(t, "odd_values", func(t *testing.T) {
		// Values a text header format cannot carry verbatim, published
		// alone so that a broker rejecting them fails no other event.
		odd := newEvent("order", " id with\ttab and newline\n", "type\r\nX-Injected: 1")
		odd.Headers = map[string]string{
			"padded":  "  leading and trailing spaces  ",
			"lines":   "line 1\nline 2\r\nline 3",
			"control": "a\x01b\x1bc\x7fd",
		}
		ps := s.publishSet(t, tg, []*event.Event{odd})
		r := &reporter{t: t}
		for _, m := range ps.copies(t, odd) {
			s.checkID(r, odd, m)
			s.checkContract(r, tg, odd, m)
			s.checkRow(r, odd, m)
			if v := s.values(m, "X-Injected"); len(v) > 0 {
				t.Errorf("a CR LF in the event_type injected the header X-Injected: %q", v)
			}
		}
	})
}

// droppedHeaders returns row headers a sink must not forward, each with a
// value starting "spoof-": every name of sink.RelayHeaders and of control
// in swapped case (a prefix with "Probe" after it), and one it forwards,
// kept: k.
func droppedHeaders(control sink.HeaderRules) map[string]string {
	h := map[string]string{"kept": "k"}
	names := append(slices.Clone(sink.RelayHeaders), control.Names...)
	for _, p := range control.Prefixes {
		names = append(names, p+"Probe")
	}
	for i, n := range names {
		h[swapCase(n)] = fmt.Sprint("spoof-", i)
	}
	return h
}

// swapCase returns s with upper and lower case ASCII letters swapped.
func swapCase(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
}

func (s *suite) testPayload(t *testing.T) {
	tg := s.newTarget(t, "pay", "{aggregate_type}")
	binary := make([]byte, 0, 256+4)
	for i := range 256 {
		binary = append(binary, byte(i))
	}
	binary = append(binary, 0xff, 0xfe, 0xc3, 0x28) // invalid UTF-8 sequences

	type payloadCase struct {
		name        string
		payload     []byte
		contentType string
	}
	cases := []payloadCase{
		{"json", []byte(`{"b": [1, 2.50, true, null],  "a":"x\"y\\z\u00e9\n",` + "\n\t" + `"nested":{"k":{}}}`), event.ContentTypeJSON},
		{"text", []byte("plain text, ünïcødé, 中文, emoji 🚚\nsecond line\r\n\ttabbed and trailing space "), event.ContentTypeText},
		{"binary", binary, event.ContentTypeBinary},
		{"empty", []byte{}, event.ContentTypeText},
	}
	if s.h.MaxMessageBytes > 0 {
		large := bytes.Repeat([]byte("0123456789abcdef"), s.h.MaxMessageBytes/2/16+1)[:s.h.MaxMessageBytes/2]
		cases = append(cases, payloadCase{"large", large, event.ContentTypeText})
	}

	var batch []*event.Event
	byName := map[string]*event.Event{}
	for i, c := range cases {
		if s.skipped("payload/" + c.name) {
			continue
		}
		e := newEvent("doc", fmt.Sprintf("d-%d", i), "doc."+c.name)
		e.Payload, e.ContentType = c.payload, c.contentType
		batch = append(batch, e)
		byName[c.name] = e
	}
	var ps *publishedSet
	if len(batch) > 0 {
		ps = s.publishSet(t, tg, batch)
	}
	for _, name := range []string{"json", "text", "binary", "empty", "large"} {
		s.run(t, name, func(t *testing.T) {
			e := byName[name]
			if e == nil {
				t.Skip("Harness.MaxMessageBytes is 0")
			}
			r := &reporter{t: t}
			for _, m := range ps.copies(t, e) {
				checkPayload(r, e, m)
				s.checkID(r, e, m)
				s.checkContract(r, tg, e, m)
			}
		})
	}
}

func (s *suite) testEmptyBatch(t *testing.T) {
	tg := s.newTarget(t, "nil", "{aggregate_type}")
	if err := publish(t, tg.snk, nil); err != nil {
		t.Errorf("Publish(nil batch) = %v, want nil", err)
	}
	if err := publish(t, tg.snk, []*event.Event{}); err != nil {
		t.Errorf("Publish(empty batch) = %v, want nil", err)
	}
	if msgs := s.h.Received(t, tg.scope); len(msgs) != 0 {
		t.Errorf("an empty batch delivered %d messages", len(msgs))
	}
}

// Sizes of the order subtest: orderEvents events over orderAggregates
// aggregates, published by orderWorkers concurrent callers in batches of at
// most orderBatch.
const (
	orderEvents     = 3000
	orderAggregates = 300
	orderWorkers    = 8
	orderBatch      = 100
)

func (s *suite) testOrder(t *testing.T) {
	tg := s.newTarget(t, "ord", "{aggregate_type}")
	events := spreadEvents(orderEvents, orderAggregates)
	d := newDriver(tg.snk, orderWorkers, orderBatch)
	ctx, cancel := context.WithTimeout(context.Background(), driveGuard)
	defer cancel()
	if err := d.run(ctx, sliceSource(events), len(events)); err != nil {
		t.Fatal(err)
	}
	if d.failures.Load() > 0 {
		t.Logf("%d events were retried: %s", d.failures.Load(), d.summary())
	}
	msgs := s.await(t, tg.scope, events)
	s.checkDelivered(t, tg, events, msgs, expect{exactlyOnce: true})
	s.checkOrder(t, events, msgs)
}

func (s *suite) testDestination(t *testing.T) {
	plain := func() []*event.Event {
		return []*event.Event{
			newEvent("order", "o-1", "created"),
			newEvent("order", "o-2", "paid"),
			newEvent("invoice", "i-1", "created"),
			newEvent("Shipment-V2", "s_1", "Dispatched"),
		}
	}
	cases := []struct {
		name, suffix string
		events       []*event.Event
		distinct     int // destinations the events must reach
	}{
		{"aggregate_type", "{aggregate_type}", plain(), 3},
		{"event_type", "{event_type}", plain(), 3},
		{"aggregate_id", "{aggregate_id}", plain(), 4},
		{"combined", "{aggregate_type}-{event_type}-{aggregate_id}", plain(), 4},
		{"fixed", "fixed", plain(), 1},
		{"sanitize", "{aggregate_type}-{aggregate_id}", []*event.Event{
			newEvent("a.b", "dots.in.id", "x"),
			newEvent("sp ace", "tab\tnl\n", "x"),
			newEvent("wild*card>", "slash/colon:q?#", "x"),
			newEvent("ünï", "ctl\x01\x7f", "x"),
			newEvent("", "", "x"),
		}, 5},
	}
	for _, c := range cases {
		s.run(t, c.name, func(t *testing.T) {
			tg := s.newTarget(t, "dst", c.suffix)
			mustPublish(t, tg.snk, c.events)
			msgs := s.await(t, tg.scope, c.events)
			s.checkDelivered(t, tg, c.events, msgs, expect{exactlyOnce: true, routingOnly: c.name == "sanitize"})
			dests := map[string]bool{}
			for _, m := range msgs {
				dests[m.Destination] = true
			}
			if len(dests) != c.distinct {
				t.Errorf("events reached %d destinations %q, want %d", len(dests), keys(dests), c.distinct)
			}
			if c.name == "sanitize" && s.h.Sanitize == nil {
				t.Log("Harness.Sanitize is nil: destinations expected with values unchanged")
			}
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func (s *suite) testAck(t *testing.T) {
	tg := s.newTarget(t, "ack", "{aggregate_type}")
	for round := range 5 {
		batch := make([]*event.Event, 40)
		for i := range batch {
			batch[i] = newEvent([]string{"order", "invoice"}[i%2], fmt.Sprintf("r%d-%d", round, i), "acked")
		}
		mustPublish(t, tg.snk, batch)
		got := s.byID(s.h.Received(t, tg.scope)) // once: no waiting allowed
		missing := 0
		for _, e := range batch {
			if len(got[e.ID]) == 0 {
				missing++
			}
		}
		if missing > 0 {
			t.Fatalf("round %d: Publish returned nil, but %d of its %d events were not retrievable right after: a publish must return only once the broker acknowledged every event", round, missing, len(batch))
		}
	}
}

func (s *suite) testDuplicates(t *testing.T) {
	tg := s.newTarget(t, "dup", "{aggregate_type}")
	batch := make([]*event.Event, 20)
	for i := range batch {
		batch[i] = newEvent([]string{"order", "invoice"}[i%2], fmt.Sprintf("a-%d", i), "dup")
		batch[i].Headers = map[string]string{"trace_id": fmt.Sprint("t-", i)}
	}
	mustPublish(t, tg.snk, batch)
	mustPublish(t, tg.snk, batch)
	// A second sink publishing the same events, like a relay restarted
	// after a crash between publish and archive.
	again := s.newSink(t, tg.scope, tg.tmpl)
	mustPublish(t, again, batch)

	msgs := s.await(t, tg.scope, batch)
	got := s.checkDelivered(t, tg, batch, msgs, expect{exactlyOnce: true})
	n := 0
	for _, e := range batch {
		n += len(got[e.ID])
	}
	t.Logf("3 publishes of %d events left %d messages", len(batch), n)
}

// restartStop is how many events the restart subtest publishes at most;
// it normally stops long before.
const restartStop = 30000

func (s *suite) testRestart(t *testing.T) {
	restart := s.h.Restart
	if restart == nil && s.h.Stop != nil {
		restart = func(t *testing.T) {
			s.h.Stop(t)
			s.h.Start(t)
		}
	}
	if restart == nil {
		t.Skip("Harness.Restart, Stop and Start are nil")
	}
	tg := s.newTarget(t, "rst", "{aggregate_type}")

	// Events over 100 aggregates, produced until the broker is back and has
	// acknowledged 300 more, so that batches are in flight when it goes.
	var stop atomic.Bool
	var events []*event.Event
	types := []string{"alpha", "beta", "gamma"}
	src := func() (*event.Event, bool) {
		if stop.Load() || len(events) == restartStop {
			return nil, true
		}
		i := len(events)
		a := i % 100
		e := newEvent(types[a%3], fmt.Sprintf("agg-%03d", a), "step")
		e.Payload = fmt.Appendf(nil, `{"aggregate":%d,"seq":%d}`, a, i/100)
		events = append(events, e)
		return e, false
	}
	d := newDriver(tg.snk, 4, 25)
	d.pace = 2 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), driveGuard)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.run(ctx, src, 500) }()

	waitAcked(t, d, 300, done)
	restart(t)
	waitAcked(t, d, d.acked.Load()+300, done)
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("published %d events across the restart; %s", len(events), d.summary())

	msgs := s.await(t, tg.scope, events)
	s.checkDelivered(t, tg, events, msgs, expect{})
	s.checkOrder(t, events, msgs)
}

// waitAcked waits until the driver acknowledged n events, failing the test
// when it stops first or driveGuard passes.
func waitAcked(t *testing.T, d *driver, n int64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(driveGuard)
	for d.acked.Load() < n {
		select {
		case err := <-done:
			t.Fatalf("publishing stopped after %d acknowledged events, before %d: %v", d.acked.Load(), n, err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events acknowledged after %v; %s", d.acked.Load(), n, driveGuard, d.summary())
		}
	}
}

func (s *suite) testOutage(t *testing.T) {
	if s.h.Stop == nil {
		t.Skip("Harness.Stop and Start are nil")
	}
	const aggregates = 50
	tg := s.newTarget(t, "out", "{aggregate_type}")
	events := spreadEvents(10*aggregates, aggregates)
	before, during := events[:2*aggregates], events[2*aggregates:3*aggregates]
	mustPublish(t, tg.snk, before[:aggregates])
	mustPublish(t, tg.snk, before[aggregates:])

	s.h.Stop(t)
	started := false
	start := func() {
		if !started {
			started = true
			s.h.Start(t)
		}
	}
	t.Cleanup(start)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	t0 := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- tg.snk.Publish(ctx, during) }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(3*time.Second + returnGuard):
		t.Fatalf("Publish while the broker is down did not return %v after its 3s deadline", returnGuard)
	}
	t.Logf("Publish while the broker is down returned after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	r := &reporter{t: t}
	for i, e := range during {
		switch f := sink.Failed(err, i); {
		case f == nil:
			r.errorf("event %s acknowledged while the broker is down", e.ID)
		case fault.ClassOf(f) != fault.Unavailable:
			r.errorf("event %s failed as %v while the broker is down; want unavailable, so that the relay waits for the broker without counting attempts or dead-lettering: %v", e.ID, fault.ClassOf(f), f)
		}
	}

	start()
	d := newDriver(tg.snk, 4, 20)
	dctx, dcancel := context.WithTimeout(context.Background(), driveGuard)
	defer dcancel()
	if err := d.run(dctx, sliceSource(events[2*aggregates:]), len(events)); err != nil {
		t.Fatal(err)
	}
	t.Logf("after Start: %s", d.summary())
	msgs := s.await(t, tg.scope, events)
	s.checkDelivered(t, tg, events, msgs, expect{})
	s.checkOrder(t, events, msgs)
}

func (s *suite) testOversize(t *testing.T) {
	if s.h.MaxMessageBytes <= 0 {
		t.Skip("Harness.MaxMessageBytes is 0")
	}
	tg := s.newTarget(t, "big", "{aggregate_type}")
	batch := []*event.Event{
		newEvent("order", "o-1", "small"),
		newEvent("order", "o-2", "huge"),
		newEvent("invoice", "i-1", "small"),
	}
	batch[1].Payload = bytes.Repeat([]byte("x"), s.h.MaxMessageBytes+1)
	batch[1].ContentType = event.ContentTypeText

	err := publish(t, tg.snk, batch)
	if f := sink.Failed(err, 1); f == nil {
		t.Errorf("an event of %d bytes, over Harness.MaxMessageBytes, was acknowledged", len(batch[1].Payload))
	} else if c := fault.ClassOf(f); c != fault.Permanent {
		t.Errorf("an event over the size limit failed as %v, want permanent so that it is dead-lettered at once: %v", c, f)
	} else {
		t.Logf("oversized event: %v", f)
	}
	for _, i := range []int{0, 2} {
		if f := sink.Failed(err, i); f != nil {
			t.Errorf("event %d of the batch failed along with the oversized one: %v (class %v); want only the oversized event to fail", i, f, fault.ClassOf(f))
		}
	}
	ok, failed := acked(err, batch)
	var want, mayAppear []*event.Event
	for _, e := range ok {
		if e != batch[1] {
			want = append(want, e)
		}
	}
	for _, e := range failed {
		if e != batch[1] {
			mayAppear = append(mayAppear, e)
		}
	}
	msgs := s.await(t, tg.scope, want)
	s.checkDelivered(t, tg, want, msgs, expect{exactlyOnce: true, mayAppear: mayAppear})
}

func (s *suite) testCancel(t *testing.T) {
	s.run(t, "before", func(t *testing.T) {
		tg := s.newTarget(t, "cxb", "{aggregate_type}")
		batch := spreadEvents(10, 10)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := publishReturns(t, tg.snk, ctx, batch, time.Now())
		t.Logf("Publish with a cancelled context: %v", err)
		checkNotPermanent(t, "cancelled context", err, batch)
		ok, failed := acked(err, batch)
		s.checkDelivered(t, tg, ok, s.await(t, tg.scope, ok), expect{exactlyOnce: true, mayAppear: failed})
		// The sink must still work after a cancelled call.
		mustPublish(t, tg.snk, failed)
		s.checkDelivered(t, tg, batch, s.await(t, tg.scope, batch), expect{exactlyOnce: true})
	})
	s.run(t, "during", func(t *testing.T) {
		tg := s.newTarget(t, "cxd", "{aggregate_type}")
		batch := spreadEvents(1000, 1000)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(time.Millisecond, cancel)
		err := publishReturns(t, tg.snk, ctx, batch, time.Now().Add(time.Millisecond))
		t.Logf("Publish cancelled during a batch of %d: %d acknowledged, %v", len(batch), len(batch)-countFailed(err, len(batch)), firstErr(err, len(batch)))
		checkNotPermanent(t, "cancelled during the batch", err, batch)
		ok, failed := acked(err, batch)
		s.checkDelivered(t, tg, ok, s.await(t, tg.scope, ok), expect{mayAppear: failed})
		d := newDriver(tg.snk, 4, 100)
		dctx, dcancel := context.WithTimeout(context.Background(), driveGuard)
		defer dcancel()
		if err := d.run(dctx, sliceSource(failed), len(failed)); err != nil {
			t.Fatalf("republishing the %d events that failed: %v", len(failed), err)
		}
		s.checkDelivered(t, tg, batch, s.await(t, tg.scope, batch), expect{})
	})
	s.run(t, "stalled", func(t *testing.T) {
		if s.h.NewStalled == nil {
			t.Skip("Harness.NewStalled is nil")
		}
		for _, how := range []string{"cancel", "deadline"} {
			scope := newScope("stl")
			snk := s.h.NewStalled(t, scope, s.template(scope, "{aggregate_type}"))
			if snk == nil {
				t.Fatal("sinktest: Harness.NewStalled returned nil")
			}
			t.Cleanup(func() { snk.Close() })
			batch := spreadEvents(10, 10)
			var ctx context.Context
			var cancel context.CancelFunc
			if how == "cancel" {
				ctx, cancel = context.WithCancel(context.Background())
				time.AfterFunc(200*time.Millisecond, cancel)
			} else {
				ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
			}
			err := publishReturns(t, snk, ctx, batch, time.Now().Add(200*time.Millisecond))
			cancel()
			t.Logf("%s on a stalled broker: %v", how, err)
			r := &reporter{t: t}
			for i, e := range batch {
				switch f := sink.Failed(err, i); {
				case f == nil:
					r.errorf("%s: event %s acknowledged by a broker that never acknowledges", how, e.ID)
				case fault.ClassOf(f) == fault.Permanent:
					r.errorf("%s: event %s failed as permanent, want unavailable or transient: %v", how, e.ID, f)
				}
			}
		}
	})
}

// publishReturns publishes batch with ctx, which ends at or before end, and
// fails the test when Publish has not returned returnGuard after end.
func publishReturns(t *testing.T, snk sink.Sink, ctx context.Context, batch []*event.Event, end time.Time) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- snk.Publish(ctx, batch) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Until(end) + returnGuard):
		t.Fatalf("Publish had not returned %v after its context ended", returnGuard)
		return nil
	}
}

func countFailed(err error, n int) int {
	c := 0
	for i := range n {
		if sink.Failed(err, i) != nil {
			c++
		}
	}
	return c
}

func firstErr(err error, n int) string {
	for i := range n {
		if f := sink.Failed(err, i); f != nil {
			return fmt.Sprintf("first failure %v (class %v)", strings.TrimSpace(f.Error()), fault.ClassOf(f))
		}
	}
	return "no failure"
}

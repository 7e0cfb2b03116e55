// Package sinktest is the conformance suite every sink.Sink passes: what
// docs/reference.md and docs/guarantees.md require of publishing, checked
// against a real or embedded broker.
//
// A sink's tests describe their broker with a Harness and call Run:
//
//	func TestConformance(t *testing.T) {
//		srv := startBroker(t)
//		sinktest.Run(t, sinktest.Harness{
//			New: func(t *testing.T, scope, tmpl string) sink.Sink {
//				return newSink(t, srv.Addr(), tmpl)
//			},
//			Received: func(t *testing.T, scope string) []sinktest.Message {
//				return readAll(t, srv.Addr(), scope+".")
//			},
//			Sanitize:        sanitize,
//			MaxMessageBytes: 1 << 20,
//			Features:        sinktest.Features{IDHeaders: []string{"Nats-Msg-Id"}},
//		})
//	}
//
// Run runs one subtest per check, one after another (never in parallel, as
// the restart and outage checks stop the broker). Each subtest publishes under
// its own scope, a short name unique to the subtest and the run, so that
// subtests never see each other's messages and a broker that keeps data
// between runs needs no cleanup. The whole suite takes a few seconds against
// a local broker; its timeouts only guard against hangs and never assert how
// fast a broker is.
//
// The subtests, by the names Harness.Skip takes:
//
//	headers/message_id     message_id and Features.IDHeaders equal the event ID
//	headers/contract       event_type, aggregate_type, aggregate_id, the ordering key, the content type
//	headers/row            the row's headers map is forwarded (nil and empty maps too)
//	headers/reserved       row headers named like contract headers do not override them
//	headers/dropped        row headers named like any header the relay sets (sink.RelayHeaders), in another case, and those Features.Control names are not forwarded; the event is acknowledged and its contract headers intact
//	headers/trace_context  a row's traceparent and tracestate arrive unchanged, beside 8 other headers
//	headers/odd_values     header values with leading and trailing spaces, tabs, CR LF and control characters arrive unchanged
//	payload/json           payload bytes unchanged: JSON with odd spacing and escapes
//	payload/text           UTF-8 text with multi-byte runes and newlines
//	payload/binary         every byte value 0..255 and invalid UTF-8
//	payload/empty          an empty payload
//	payload/large          half of MaxMessageBytes (skipped when it is 0)
//	empty_batch            Publish of an empty batch returns nil
//	order                  thousands of events over hundreds of aggregates published like the pipeline does: no loss, first deliveries in order per aggregate
//	destination/*          templates: aggregate_type, event_type, aggregate_id, combined, fixed, sanitize
//	ack                    when Publish returns nil, every event is already retrievable
//	duplicates             publishing events again (same or new sink): same message_id on every copy; one copy when Features.DedupesByID
//	restart                the broker restarts while batches are in flight (Restart, or Stop and Start): failures are unavailable or transient, never permanent; retrying them loses nothing, keeps message_id and per-aggregate order
//	outage                 publishing while the broker is down fails as fault.Unavailable for every event (so the relay waits without dead-lettering); retries after Start lose nothing
//	oversize               an event over MaxMessageBytes fails as fault.Permanent, the rest of its batch is acknowledged
//	cancel/before          an already cancelled context
//	cancel/during          a context cancelled while a large batch is being published; the sink stays usable
//	cancel/stalled         a broker that never acknowledges (NewStalled): Publish returns soon after ctx ends
//	ordered/runs           a sink.Ordered sink given runs of several events per aggregate, retried from each aggregate's first failure: no loss, first deliveries in order, never an event acknowledged after an earlier one of its aggregate in the call failed
//	ordered/oversize       a sink.Ordered sink given a run with an event over MaxMessageBytes in the middle: it fails as permanent, and the events after it arrive once each, after the ones before it
package sinktest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// Harness connects the suite to one sink implementation and its broker.
// New and Received are required; every other field is optional and a nil or
// zero value skips the subtests that need it.
type Harness struct {
	// New returns a sink publishing to destinations rendered from tmpl, the
	// template Template(scope, suffix) returned. scope is unique to the
	// subtest; a harness that must prepare something per scope (a stream
	// covering the scope's subjects, say) does it here. New may be called
	// more than once with the same scope (to simulate a relay restart), and
	// must fail the test (t.Fatal) when the sink cannot be created. The suite
	// closes the returned sink when the subtest ends.
	//
	// A broker whose destinations must exist before a publish (SQS queues)
	// may return a wrapper sink that creates the destinations of each batch
	// before calling the real sink's Publish.
	New func(t *testing.T, scope, tmpl string) sink.Sink

	// Received returns every message the broker holds or delivered so far on
	// the destinations of scope (those rendered from a template
	// Template(scope, ...) returned), duplicates included. Messages of one
	// destination (and, where the broker has ordering keys, one key) must be
	// in delivery order; messages of different destinations or keys may be
	// interleaved in any way. Received is called
	// repeatedly while the suite waits for messages, so it must return
	// everything each time: a harness for a broker that removes what it
	// delivers (SQS) keeps what it received so far and appends to it.
	Received func(t *testing.T, scope string) []Message

	// Template returns the destination template for scope and suffix, a
	// template fragment such as "{aggregate_type}", "{aggregate_type}-{event_type}"
	// or "fixed" (the suite only uses letters, digits, '-' and placeholders).
	// The result must keep suffix's placeholders and be unique to scope, for
	// example "http://127.0.0.1:8080/" + scope + "/" + suffix for a webhook
	// or scope + "-" + suffix + ".fifo" for an SQS FIFO queue. Nil means
	// scope + "." + suffix, which suits NATS subjects and Kafka topics.
	Template func(scope, suffix string) string

	// Sanitize is the sink's mapping of the runes of a template value that
	// the broker does not allow in a destination name (see template.Template).
	// The suite renders the destination it expects each event to arrive at
	// with template.Parse(Template(scope, suffix), Sanitize); nil means
	// values are used unchanged.
	Sanitize func(rune) rune

	// Restart stops the broker and starts it again on the same address,
	// keeping the messages it stored, while the suite publishes. A harness
	// whose broker cannot keep its data across a restart may drop every
	// client connection instead. Nil uses Stop then Start; when those are
	// nil too, the restart subtest is skipped.
	Restart func(t *testing.T)

	// Stop makes the broker unreachable (stops it, keeping its data) and
	// Start brings it back on the same address. Both nil skips the outage
	// subtest. After Stop the suite always calls Start, even when the
	// subtest fails, so later subtests find the broker running.
	Stop  func(t *testing.T)
	Start func(t *testing.T)

	// NewStalled returns a sink like New's whose broker accepts messages but
	// never acknowledges them (a subscriber that never replies, an HTTP
	// handler that blocks), with the sink's own publish timeouts well above
	// 10 seconds, so that only the context can end a Publish. Nil skips the
	// cancel/stalled subtest.
	NewStalled func(t *testing.T, scope, tmpl string) sink.Sink

	// MaxMessageBytes is the broker's (or the sink's configured) message size
	// limit: an event whose payload is MaxMessageBytes+1 bytes must fail as
	// fault.Permanent. Zero skips the oversize and payload/large subtests.
	MaxMessageBytes int

	// DeliveryTimeout bounds the wait for acknowledged events to show up in
	// Received (only the ack subtest requires them at once). It is a guard,
	// not an expectation: a subtest only waits that long when an event is
	// missing. Default 15s.
	DeliveryTimeout time.Duration

	// Inspect, when set, is called for every copy of every event the
	// headers subtests receive, for checks only the sink's own tests know
	// about (Message.Raw holds the broker's message).
	Inspect func(t *testing.T, e *event.Event, m Message)

	// Features declares what the broker guarantees.
	Features Features

	// Skip maps subtest names, as listed in the package documentation
	// ("payload/binary", or a whole group such as "cancel"), to the reason
	// they do not apply to this sink; Run skips them with that reason.
	Skip map[string]string
}

// Features declares the broker and sink properties that change what the
// suite expects. The zero value is the strict default: ordered, no
// deduplication, no ordering key, no extra ID headers.
type Features struct {
	// Unordered means the broker does not keep per-aggregate order (SQS
	// standard queues): the order subtests check only that nothing is lost.
	Unordered bool

	// DedupesByID means the broker drops a message whose ID it already
	// stored (the JetStream duplicate window, SQS FIFO deduplication), so
	// publishing an event several times leaves exactly one copy. Without it
	// the suite accepts any number of copies of a republished event, as long
	// as each carries the same message_id.
	DedupesByID bool

	// KeyedByAggregate means Message.Key must equal the event's ordering
	// key (event.Event.Key: its aggregate_id unless outbox.order_by names
	// another column) on every message (Kafka record key, SQS
	// MessageGroupId).
	KeyedByAggregate bool

	// IDHeaders names the headers besides message_id that must carry the
	// event ID on every copy, like "Nats-Msg-Id" or "Idempotency-Key". A
	// harness may report a broker's ID field that is not a header (SQS's
	// MessageDeduplicationId) under a name of its choosing and list it here.
	IDHeaders []string

	// ContentTypeHeader names the header that must carry event.ContentType,
	// such as "Content-Type"; empty skips that check.
	ContentTypeHeader string

	// CaseInsensitiveHeaders makes the suite compare header names ignoring
	// case, for brokers that canonicalise them (HTTP).
	CaseInsensitiveHeaders bool

	// Control names the row headers the broker acts on, which the sink
	// must drop (sink.NATSRules, sink.SQSRules, sink.HTTPRules); the zero
	// value for a broker that acts on none (Kafka).
	Control sink.HeaderRules
}

// Message is one message as the broker delivered or stored it.
type Message struct {
	// Destination is where the message arrived, spelled like a rendered
	// template: the subject, topic or queue name, or the URL of a webhook
	// request.
	Destination string
	// Key is the ordering key the broker saw (Kafka record key, SQS
	// MessageGroupId), or empty when the broker has none.
	Key string
	// Headers holds every header (or message attribute) of the message with
	// all its values, so that a header sent twice is seen twice. Names are
	// as the broker reports them (see Features.CaseInsensitiveHeaders).
	Headers map[string][]string
	// Payload is the body as a consumer gets it, decoded as the sink
	// documents when the broker cannot carry raw bytes.
	Payload []byte
	// Raw is the broker's own message, for Harness.Inspect; the suite does
	// not look at it.
	Raw any
}

// Run runs the conformance suite against the sink and broker h describes,
// one subtest per check (see the package documentation for the list).
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Received == nil {
		t.Fatal("sinktest: Harness.New and Harness.Received are required")
	}
	if (h.Stop == nil) != (h.Start == nil) {
		t.Fatal("sinktest: set both Harness.Stop and Harness.Start, or neither")
	}
	for name := range h.Skip {
		if !knownSubtest(name) {
			t.Fatalf("sinktest: Harness.Skip names %q, which is not a subtest (see the package documentation)", name)
		}
	}
	s := &suite{h: h}
	s.run(t, "headers", s.testHeaders)
	s.run(t, "payload", s.testPayload)
	s.run(t, "empty_batch", s.testEmptyBatch)
	s.run(t, "order", s.testOrder)
	s.run(t, "destination", s.testDestination)
	s.run(t, "ack", s.testAck)
	s.run(t, "duplicates", s.testDuplicates)
	s.run(t, "restart", s.testRestart)
	s.run(t, "outage", s.testOutage)
	s.run(t, "oversize", s.testOversize)
	s.run(t, "cancel", s.testCancel)
	s.run(t, "ordered", s.testOrdered)
}

// subtests lists every subtest by the name Harness.Skip takes.
var subtests = []string{
	"headers/message_id", "headers/contract", "headers/row", "headers/reserved", "headers/dropped", "headers/trace_context", "headers/odd_values",
	"payload/json", "payload/text", "payload/binary", "payload/empty", "payload/large",
	"empty_batch", "order",
	"destination/aggregate_type", "destination/event_type", "destination/aggregate_id",
	"destination/combined", "destination/fixed", "destination/sanitize",
	"ack", "duplicates", "restart", "outage", "oversize",
	"cancel/before", "cancel/during", "cancel/stalled",
	"ordered/runs", "ordered/oversize",
}

// knownSubtest reports whether name is a subtest or a group of subtests.
func knownSubtest(name string) bool {
	for _, n := range subtests {
		if n == name || strings.HasPrefix(n, name+"/") {
			return true
		}
	}
	return false
}

// Classes returns, for each of the n events of a Publish that returned
// err, the class of its error (fault.Class.String, prefixed with "suspect-"
// for an error marked with fault.AsSuspect) or "ok": a compact form for a
// sink's own tests to compare with what they expect.
func Classes(err error, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "ok"
		if e := sink.Failed(err, i); e != nil {
			out[i] = fault.ClassOf(e).String()
			if fault.IsSuspect(e) {
				out[i] = "suspect-" + out[i]
			}
		}
	}
	return out
}

// CheckSent checks the headers a sink built for one message, sent, against
// the rules every sink follows: each header of own (the headers the sink
// sets itself, such as message_id, with their values) is sent exactly once
// with its value, and no other header is named like one of
// sink.RelayHeaders or one control names, compared without regard to case.
// It returns the first problem found, or nil. Sink tests and fuzz targets
// call it on the headers built from hostile row headers.
func CheckSent(sent map[string][]string, own map[string]string, control sink.HeaderRules) error {
	for name, want := range own {
		var got []string
		for k, vs := range sent {
			if strings.EqualFold(k, name) {
				got = append(got, vs...)
			}
		}
		if len(got) != 1 || got[0] != want {
			return fmt.Errorf("header %s sent as %q, want once %q", name, got, want)
		}
	}
	for k, vs := range sent {
		if ownName(own, k) {
			continue
		}
		for _, r := range sink.RelayHeaders {
			if strings.EqualFold(k, r) {
				return fmt.Errorf("header %s: %q sent, named like the relay's %s", k, vs, r)
			}
		}
		if control.Control(k) {
			return fmt.Errorf("header %s: %q sent, which the broker acts on", k, vs)
		}
	}
	return nil
}

// ownName reports whether own has name, in any case.
func ownName(own map[string]string, name string) bool {
	for k := range own {
		if strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

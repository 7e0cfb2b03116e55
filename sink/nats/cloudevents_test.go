package nats

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

// TestCloudEvents publishes through embedded JetStream with the
// cloudevents envelope and reads each stored message with the CloudEvents
// SDK's NATS binding: every attribute is right, row headers in the ce-
// namespace are dropped, the contract headers stay, and an event without
// event_type fails as permanent. Without the envelope no ce- header is
// published.
func TestCloudEvents(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{Envelope: envelopetest.New()})
	events := envelopetest.Events()
	if err := s.Publish(context.Background(), events); err != nil {
		t.Fatal(err)
	}
	bad := testEvent(9, "order", "o-9")
	bad.EventType = ""
	if err := s.Publish(context.Background(), []*event.Event{bad}); fault.ClassOf(sink.Failed(err, 0)) != fault.Permanent {
		t.Errorf("event without event_type: %v, want a permanent error", err)
	}
	plain := newStreamSink(t, srv.URL(), Options{})
	if err := plain.Publish(context.Background(), []*event.Event{testEvent(10, "order", "o-10")}); err != nil {
		t.Fatal(err)
	}

	msgs := storedMsgs(t, s)
	if len(msgs) != len(events)+1 {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(events)+1)
	}
	for _, m := range msgs[:len(events)] {
		checkCloudEvent(t, m, envelopetest.Of(events, m.Headers().Get(jetstream.MsgIDHeader)))
	}
	for k := range msgs[len(events)].Headers() {
		if strings.HasPrefix(strings.ToLower(k), "ce-") {
			t.Errorf("without the envelope: header %s published", k)
		}
	}
}

func checkCloudEvent(t *testing.T, m jetstream.Msg, e *event.Event) {
	t.Helper()
	if e == nil {
		t.Fatalf("message with Nats-Msg-Id %q was not published", m.Headers().Get(jetstream.MsgIDHeader))
	}
	got, err := envelopetest.FromNATS(m.Headers(), m.Data())
	if err != nil {
		t.Fatalf("%s: the SDK rejects the message: %v (headers %v)", e.ID, err, m.Headers())
	}
	if err := envelopetest.Match(got, e, envelopetest.Source+"/order"); err != nil {
		t.Errorf("%s: %v", e.ID, err)
	}
	h := m.Headers()
	if h.Get("message_id") != e.ID || h.Get("event_type") != e.EventType || h.Get("aggregate_id") != e.AggregateID {
		t.Errorf("%s: contract headers changed: %v", e.ID, h)
	}
	for k, v := range h {
		if strings.Contains(strings.Join(v, ","), "spoofed") && strings.HasPrefix(strings.ToLower(k), "ce-") {
			t.Errorf("%s: row header %s=%v forwarded in the envelope's namespace", e.ID, k, v)
		}
	}
	if e.Headers["trace_id"] != "" && h.Get("trace_id") != "t-1" {
		t.Errorf("%s: row header trace_id not forwarded: %v", e.ID, h)
	}
}

package nats

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink/debezium"
)

// TestDebeziumFormat publishes events shaped by sink.format debezium and
// reads them as a consumer of Debezium Server's NATS JetStream sink does:
// subject outbox.event.<aggregate_type>, the event id in the id header,
// the placed event type in the eventType header, the body the payload as a
// JSON string; Nats-Msg-Id and message_id stay the event id.
func TestDebeziumFormat(t *testing.T) {
	t.Parallel()
	srv := startServer(t, testenv.NATSOptions{})
	s := newSink(t, srv.URL(), "outbox.event.{aggregate_type}", Options{})
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	f, err := debezium.New(debezium.Options{Placements: []debezium.Placement{{Field: debezium.FieldEventType, Name: "eventType"}}})
	if err != nil {
		t.Fatal(err)
	}
	events := testEvents(6, 2)
	if err := s.Publish(context.Background(), f.Batch(events)); err != nil {
		t.Fatal(err)
	}
	msgs := storedMsgs(t, s)
	if len(msgs) != len(events) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(events))
	}
	for i, m := range msgs {
		e, h := events[i], m.Headers()
		var payload string
		if err := json.Unmarshal(m.Data(), &payload); err != nil || payload != string(e.Payload) {
			t.Errorf("%s: body %s is not the payload as a JSON string: %v", e.ID, m.Data(), err)
		}
		if m.Subject() != "outbox.event.order" || h.Get("id") != e.ID || h.Get("eventType") != e.EventType ||
			h.Get(jetstream.MsgIDHeader) != e.ID || h.Get("message_id") != e.ID || h.Get("Content-Type") != event.ContentTypeJSON {
			t.Errorf("%s: subject %s, headers %v", e.ID, m.Subject(), h)
		}
	}
}

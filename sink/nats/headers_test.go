package nats

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
)

var benchEvent = &event.Event{ID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", AggregateType: "order", AggregateID: "order-42",
	EventType: "created", ContentType: event.ContentTypeJSON, Headers: map[string]string{"source": "relaybench"},
	Payload: []byte(`{"id": 42}`)}

// TestHeadersCapped checks that appending to one header value leaves the
// others alone (the values share a backing array).
func TestHeadersCapped(t *testing.T) {
	h := headers(benchEvent)
	h.Add("message_id", "x")
	if h.Get("event_type") != "created" || h.Get("aggregate_type") != "order" || h.Get(jetstream.MsgIDHeader) != benchEvent.ID {
		t.Fatalf("an append overwrote another header: %v", h)
	}
}

// BenchmarkHeaders measures building the message headers of one event and
// the header check and sizing nats.go does per message (its encoding is
// unexported).
func BenchmarkHeaders(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		m := &nats.Msg{Subject: "order", Header: headers(benchEvent), Data: benchEvent.Payload}
		if m.Size() == 0 { // Size validates and sizes the headers
			b.Fatal("empty message")
		}
	}
}

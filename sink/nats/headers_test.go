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
	h := new(headerSet).headers(benchEvent)
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
	hs := new(headerSet)
	for b.Loop() {
		m := &nats.Msg{Subject: "order", Header: hs.headers(benchEvent), Data: benchEvent.Payload}
		if m.Size() == 0 { // Size validates and sizes the headers
			b.Fatal("empty message")
		}
	}
}

// TestHeadersReused builds the headers of two events in one headerSet: the
// second message carries none of the first one's row headers.
func TestHeadersReused(t *testing.T) {
	hs := new(headerSet)
	first := *benchEvent
	first.Headers = map[string]string{"tenant": "t1", "trace": "a"}
	hs.headers(&first)
	second := *benchEvent
	second.ID, second.Headers = "6ba7b811-9dad-11d1-80b4-00c04fd430c8", map[string]string{"trace": "b"}
	h := hs.headers(&second)
	if len(h) != 7 || h.Get("tenant") != "" || h.Get("trace") != "b" || h.Get("message_id") != second.ID {
		t.Fatalf("headers of the second event: %v", h)
	}
}

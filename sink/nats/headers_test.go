package nats

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

var benchEvent = &event.Event{ID: "6ba7b810-9dad-11d1-80b4-00c04fd430c8", AggregateType: "order", AggregateID: "order-42",
	EventType: "created", ContentType: event.ContentTypeJSON, Headers: map[string]string{"source": "relaybench"},
	Payload: []byte(`{"id": 42}`)}

// testRows is the row header filter of a sink without an envelope.
var testRows = sink.NewHeaderFilter(sink.NATSRules, "", nil)

// TestHeadersCapped checks that appending to one header value leaves the
// others alone (the values share a backing array).
func TestHeadersCapped(t *testing.T) {
	h := new(headerSet).headers(benchEvent, testRows)
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
		m := &nats.Msg{Subject: "order", Header: hs.headers(benchEvent, testRows), Data: benchEvent.Payload}
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
	hs.headers(&first, testRows)
	second := *benchEvent
	second.ID, second.Headers = "6ba7b811-9dad-11d1-80b4-00c04fd430c8", map[string]string{"trace": "b"}
	h := hs.headers(&second, testRows)
	if len(h) != 7 || h.Get("tenant") != "" || h.Get("trace") != "b" || h.Get("message_id") != second.ID {
		t.Fatalf("headers of the second event: %v", h)
	}
}

// wantHeaders is the headers of e built the plain way.
func wantHeaders(e *event.Event) nats.Header {
	h := nats.Header{}
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	for k, v := range map[string]string{jetstream.MsgIDHeader: e.ID, "message_id": e.ID, "event_type": e.EventType,
		"aggregate_type": e.AggregateType, "aggregate_id": e.AggregateID, "Content-Type": e.ContentType} {
		h[k] = []string{v}
	}
	return h
}

// TestHeadersSequence builds the headers of events one after another in
// one headerSet, with row header names that stay, change, keep their count
// with other names, collide with a contract header, or go, and with a
// caller changing the map in between: each message carries exactly its own
// headers.
func TestHeadersSequence(t *testing.T) {
	rows := []map[string]string{
		{"source": "a"}, {"source": "b"}, {"tenant": "t"}, {"source": "c", "tenant": "u"},
		{"tenant": "v", "source": "d"}, {"source": "e", "trace": "x"}, nil, nil, {"event_type": "forged"},
		{"event_type": "forged", "x": "1"}, {"x": "2", "y": "3"}, {}, {"source": "f"}, {"event_type": "forged"}, {"source": "g"},
	}
	hs := new(headerSet)
	for i, r := range rows {
		e := *benchEvent
		e.ID, e.EventType, e.AggregateID, e.Headers = fmt.Sprintf("id-%d", i), fmt.Sprintf("type-%d", i), fmt.Sprintf("agg-%d", i), r
		h := hs.headers(&e, testRows)
		if want := wantHeaders(&e); !maps.EqualFunc(h, want, slices.Equal) {
			t.Fatalf("event %d: headers %v, want %v", i, h, want)
		}
		if i == 6 { // as cloudEvent does
			h["ce-id"] = []string{"x"}
			hs.changed()
		}
	}
}

// FuzzHeaders builds the headers of events with arbitrary row headers, two
// after another in one headerSet: the contract headers are sent once with
// the event's values, no row header named like the relay's or a JetStream
// one is sent, and every other row header is sent with its value.
func FuzzHeaders(f *testing.F) {
	f.Add("tenant", "t1", "Nats-Rollup", "sub")
	f.Add("nats-msg-id", "evil7", "MESSAGE_ID", "evil8")
	f.Add("Nats-TTL", "1s", "status", "404")
	f.Add("message_id", "x", "event_type", "y")
	f.Add("\xff\xfe", "\x00", "a b", "\r\n")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		hs := new(headerSet)
		for _, rows := range []map[string]string{{k1: v1, k2: v2}, {k2: v1, "x": v2}} {
			e := *benchEvent
			e.Headers = rows
			h := hs.headers(&e, testRows)
			own := map[string]string{jetstream.MsgIDHeader: e.ID, "message_id": e.ID, "event_type": e.EventType,
				"aggregate_type": e.AggregateType, "aggregate_id": e.AggregateID, "Content-Type": e.ContentType}
			if err := sinktest.CheckSent(h, own, sink.NATSRules); err != nil {
				t.Fatalf("row headers %q: %v", rows, err)
			}
			for k, v := range rows {
				if testRows.Reason(k) == "" && !slices.Equal(h[k], []string{v}) {
					t.Fatalf("row header %q: %q sent as %q", k, v, h[k])
				}
			}
			if len(h) > len(own)+len(rows) {
				t.Fatalf("%d headers from %d row headers: %v", len(h), len(rows), h)
			}
		}
	})
}

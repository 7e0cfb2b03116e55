package webhook

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink/debezium"
)

// TestDebeziumFormat posts events shaped by sink.format debezium with an
// envelope placement: the body is {"payload": <the payload as a JSON
// string>, "type": <event type>}, the Id header holds the event id, and
// Idempotency-Key and message_id stay the event id.
func TestDebeziumFormat(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_type}"})
	f, err := debezium.New(debezium.Options{Placements: []debezium.Placement{{Field: debezium.FieldEventType, Envelope: true, Name: "type"}}})
	if err != nil {
		t.Fatal(err)
	}
	events := testEvents(3)
	if err := s.Publish(context.Background(), f.Batch(events)); err != nil {
		t.Fatal(err)
	}
	byID := map[string]*event.Event{}
	for _, e := range events {
		byID[e.ID] = e
	}
	reqs := rc.requests()
	if len(reqs) != len(events) {
		t.Fatalf("receiver got %d requests, want %d", len(reqs), len(events))
	}
	for _, r := range reqs {
		id := r.Header.Get("Id")
		e := byID[id]
		if e == nil {
			t.Fatalf("request with Id %q, headers %v", id, r.Header)
		}
		var body struct{ Payload, Type string }
		if err := json.Unmarshal(r.Body, &body); err != nil || body.Payload != string(e.Payload) || body.Type != e.EventType {
			t.Errorf("%s: body %s: %v", id, r.Body, err)
		}
		if r.Header.Get(HeaderIdempotencyKey) != id || r.Header.Get("message_id") != id || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: headers %v", id, r.Header)
		}
	}
}

package kafka

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

// TestCloudEvents publishes to kfake with the cloudevents envelope and
// reads each record back as the Kafka binding says, with the CloudEvents
// SDK's attribute tables: every attribute is right, row headers in the ce_
// namespace are dropped, the record key and contract headers stay, and an
// event without event_type fails as permanent. Without the envelope no ce_
// header is published.
func TestCloudEvents(t *testing.T) {
	c := newCluster(t, kfake.AllowAutoTopicCreation())
	s := newSink(t, c.ListenAddrs(), "ce", Options{Envelope: envelopetest.New()})
	events := envelopetest.Events()
	if err := s.Publish(context.Background(), events); err != nil {
		t.Fatal(err)
	}
	bad := testEvent(9, "order", "o-9")
	bad.EventType = ""
	if err := s.Publish(context.Background(), []*event.Event{bad}); fault.ClassOf(sink.Failed(err, 0)) != fault.Permanent {
		t.Errorf("event without event_type: %v, want a permanent error", err)
	}
	plain := newSink(t, c.ListenAddrs(), "plain", Options{})
	if err := plain.Publish(context.Background(), []*event.Event{testEvent(10, "order", "o-10")}); err != nil {
		t.Fatal(err)
	}

	recs := readTopics(t, c.ListenAddrs(), "ce")
	if len(recs) != len(events) {
		t.Fatalf("topic holds %d records, want %d", len(recs), len(events))
	}
	for _, r := range recs {
		id, _ := header(r, "message_id")
		e := envelopetest.Of(events, id)
		if e == nil {
			t.Fatalf("record with message_id %q was not published", id)
		}
		checkRecord(t, r, e)
	}
	for _, r := range readTopics(t, c.ListenAddrs(), "plain") {
		for _, h := range r.Headers {
			if strings.HasPrefix(strings.ToLower(h.Key), "ce_") {
				t.Errorf("without the envelope: header %s published", h.Key)
			}
		}
	}
}

func checkRecord(t *testing.T, r *kgo.Record, e *event.Event) {
	t.Helper()
	var hs []envelopetest.Header
	for _, h := range r.Headers {
		hs = append(hs, envelopetest.Header{Key: h.Key, Value: h.Value})
	}
	got, err := envelopetest.FromKafka(hs, r.Value)
	if err != nil {
		t.Fatalf("%s: the record is no valid CloudEvent: %v (headers %v)", e.ID, err, r.Headers)
	}
	if err := envelopetest.Match(got, e, envelopetest.Source+"/order"); err != nil {
		t.Errorf("%s: %v", e.ID, err)
	}
	if string(r.Key) != e.AggregateID {
		t.Errorf("%s: key %q, want %q", e.ID, r.Key, e.AggregateID)
	}
	for _, name := range []string{"event_type", "aggregate_type", "aggregate_id", "content-type"} {
		if _, n := header(r, name); n != 1 {
			t.Errorf("%s: %d headers %s, want 1", e.ID, n, name)
		}
	}
	for _, h := range r.Headers {
		if _, n := header(r, h.Key); strings.HasPrefix(strings.ToLower(h.Key), "ce_") && (n != 1 || string(h.Value) == "spoofed") {
			t.Errorf("%s: header %s=%q (%d of them): the row's header in the ce_ namespace was forwarded", e.ID, h.Key, h.Value, n)
		}
	}
	if e.Headers["trace_id"] != "" {
		if v, _ := header(r, "trace_id"); v != "t-1" {
			t.Errorf("%s: row header trace_id not forwarded", e.ID)
		}
	}
}

package pubsub

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// FuzzMessage routes and builds the message of events with arbitrary
// aggregate type and id, event type, row headers and payload, under a
// topic template that starts with literal letters: the topic is always a
// valid topic ID (sanitized and cut, never a failure); the ordering key is
// valid UTF-8 of at most 1024 bytes, the aggregate id itself when it is
// one; and the message is either refused as fault.Permanent or carries
// only attributes Pub/Sub accepts (at most 100, names of 1 to 256 bytes
// not starting with "goog", values of at most 1024 bytes, all UTF-8), the
// contract attributes with the event's values and every other row header
// with its value.
func FuzzMessage(f *testing.F) {
	f.Add("order", "o-1", "created", "tenant", "t1", "goog-trace", "x", []byte(`{}`))
	f.Add("GOOG", "goog", "x", "GOOGfoo", "v", "googclient_x", "v", []byte(nil))
	f.Add("a\xffb", "\xff\xfe", "\xc3", "\xff", "v", "k", "\xff", []byte{0xff})
	f.Add(strings.Repeat("z", 300), strings.Repeat("é", 600), "", strings.Repeat("k", 257), "v", "big", strings.Repeat("v", 1025), []byte("x"))
	f.Add("../../topics/x", "projects/p/topics/y", "%2F", "message_id", "evil", "Aggregate_ID", "evil", []byte("x"))
	f.Add("", "", "", "", "", "\x00", "\x00", []byte(""))
	s := newSink(f, "127.0.0.1:1", "ev.{aggregate_type}.{aggregate_id}", Options{})
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, aggType, aggID, evType, k1, v1, k2, v2 string, payload []byte) {
		e := &event.Event{ID: "00000000-0000-4000-8000-000000000001", AggregateType: aggType, AggregateID: aggID,
			EventType: evType, Payload: payload, ContentType: event.ContentTypeJSON, Headers: map[string]string{k1: v1, k2: v2}}
		ref, err := s.ref(e)
		if err != nil {
			t.Fatalf("topic of %q/%q: %v", aggType, aggID, err)
		}
		if err := destname.PubSubTopic(ref.topic); err != nil {
			t.Fatalf("rendered topic: %v", err)
		}
		if !utf8.ValidString(ref.key) || len(ref.key) > maxOrderingKey || (utf8.ValidString(aggID) && len(aggID) <= maxOrderingKey && ref.key != aggID) {
			t.Fatalf("ordering key %q of aggregate id %q", ref.key, aggID)
		}
		if again, _ := s.ref(e); again != ref {
			t.Fatalf("routing is not deterministic: %v then %v", ref, again)
		}
		m, err := s.message(e, ref.key)
		if err != nil {
			if fault.ClassOf(err) != fault.Permanent {
				t.Fatalf("refused as %v, want permanent: %v", fault.ClassOf(err), err)
			}
			return
		}
		if len(m.Attributes) > maxAttributes {
			t.Fatalf("%d attributes", len(m.Attributes))
		}
		sent := map[string][]string{}
		for k, v := range m.Attributes {
			if k == "" || len(k) > maxAttrNameBytes || len(v) > maxAttrValueBytes || !utf8.ValidString(k) || !utf8.ValidString(v) ||
				strings.HasPrefix(strings.ToLower(k), "goog") {
				t.Fatalf("attribute %q=%q Pub/Sub refuses", k, v)
			}
			sent[k] = []string{v}
		}
		own := map[string]string{attrMessageID: e.ID, attrEventType: e.EventType, attrAggregateType: e.AggregateType,
			attrAggregateID: e.AggregateID, attrContentType: e.ContentType}
		if err := sinktest.CheckSent(sent, own, Rules); err != nil {
			t.Fatalf("row headers %q: %v", e.Headers, err)
		}
		for k, v := range e.Headers {
			if s.rows.Forward(k) && m.Attributes[k] != v {
				t.Fatalf("row header %q=%q arrived as %q", k, v, m.Attributes[k])
			}
		}
	})
}

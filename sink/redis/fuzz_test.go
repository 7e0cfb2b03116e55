package redis

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// FuzzFields builds entries of events with arbitrary row headers, ids and
// payload, with and without the CloudEvents envelope: the relay's fields
// are set once with the event's values and payload is last, no row header
// named like them, like payload or, with the envelope, in the ce_
// namespace is sent, every other row header arrives as a field with its
// value, and the stream rendered from the aggregate type is a valid name.
func FuzzFields(f *testing.F) {
	f.Add("tenant", "t1", "PAYLOAD", "x", "order", []byte(`{}`), false)
	f.Add("Message_ID", "evil", "ce_id", "x", "a b/c", []byte{0xff}, true)
	f.Add("", "", "payload", "\x00", "", []byte(nil), true)
	env, err := envelope.New("urn:test")
	if err != nil {
		f.Fatal(err)
	}
	tmpl, err := template.Parse("s.{aggregate_type}", sanitize)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, aggregateType string, payload []byte, withEnv bool) {
		e := &event.Event{ID: "00000000-0000-4000-8000-000000000001", AggregateType: aggregateType, AggregateID: "a1",
			EventType: "created", Payload: payload, ContentType: event.ContentTypeJSON, Headers: map[string]string{k1: v1, k2: v2}}
		s := &Sink{opts: Options{}.withDefaults()}
		if withEnv {
			s.opts.Envelope = env
		}
		s.rows = sink.NewHeaderFilter(sink.RedisRules, envelope.Kafka.ReservedPrefix(s.opts.Envelope), sink.NewHeaderDrops(slog.New(slog.DiscardHandler)))
		vals := s.fields(e)
		if vals[len(vals)-2] != fieldPayload || string(vals[len(vals)-1].([]byte)) != string(payload) {
			t.Fatalf("last field %v", vals[len(vals)-2:])
		}
		sent := map[string][]string{}
		for i := 0; i+1 < len(vals)-2; i += 2 {
			sent[vals[i].(string)] = append(sent[vals[i].(string)], vals[i+1].(string))
		}
		own := map[string]string{fieldMessageID: e.ID, fieldEventType: e.EventType, fieldAggregateType: e.AggregateType,
			fieldAggregateID: e.AggregateID, fieldContentType: e.ContentType}
		for k, v := range sent {
			if withEnv && envelope.Kafka.Owns(k) {
				own[k] = v[0]
			}
		}
		if err := sinktest.CheckSent(sent, own, sink.RedisRules); err != nil {
			t.Fatalf("row headers %q: %v", e.Headers, err)
		}
		for k, v := range e.Headers {
			if s.rows.Reason(k) == "" && !(withEnv && envelope.Kafka.Owns(k)) {
				if got := sent[k]; len(got) != 1 || got[0] != v {
					t.Fatalf("row header %q = %q sent as %q", k, v, got)
				}
			}
		}
		if name := tmpl.Render(e); !strings.HasPrefix(name, "s.") || strings.ContainsFunc(name[2:], func(r rune) bool { return sanitize(r) != r }) {
			t.Fatalf("stream %q", name)
		}
	})
}

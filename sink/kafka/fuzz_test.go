package kafka

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// FuzzRecordHeaders builds records of events with arbitrary row headers and
// aggregate id, without and with the CloudEvents envelope's namespace: the
// contract headers are sent once with the event's values, no row header
// named like the relay's (or in the envelope's namespace) is sent, every
// other row header is sent once with its bytes, in name order, before the
// contract headers.
func FuzzRecordHeaders(f *testing.F) {
	f.Add("tenant", "t1", "Nats-Rollup", "sub", "a1")
	f.Add("nats-msg-id", "evil7", "MESSAGE_ID", "evil8", "a1")
	f.Add("content-type", "x", "ce_id", "y", "")
	f.Add("\xff\xfe", "\x00", "a b", "\r\n", "\xff")
	filters := []*sink.HeaderFilter{
		sink.NewHeaderFilter(sink.KafkaRules, "", nil),
		sink.NewHeaderFilter(sink.KafkaRules, envelope.Kafka.ReservedPrefix(&envelope.CloudEvents{}), nil),
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, aggregateID string) {
		e := testEvent(1, "order", aggregateID)
		e.Headers = map[string]string{k1: v1, k2: v2}
		for i, rows := range filters {
			r := record(e, "outbox.order", rows)
			if string(r.Key) != aggregateID || r.Key == nil || string(r.Value) != string(e.Payload) {
				t.Fatalf("key %q (nil %v), value %q", r.Key, r.Key == nil, r.Value)
			}
			sent := map[string][]string{}
			var names []string
			for _, h := range r.Headers {
				sent[h.Key] = append(sent[h.Key], string(h.Value))
				names = append(names, h.Key)
			}
			own := map[string]string{"message_id": e.ID, "event_type": e.EventType, "aggregate_type": e.AggregateType,
				"aggregate_id": e.AggregateID, "content-type": e.ContentType}
			if err := sinktest.CheckSent(sent, own, sink.KafkaRules); err != nil {
				t.Fatalf("filter %d, row headers %q: %v", i, e.Headers, err)
			}
			var forwarded []string
			for k, v := range e.Headers {
				if i == 1 && len(k) >= 3 && strings.EqualFold(k[:3], "ce_") && sent[k] != nil {
					t.Fatalf("row header %q sent in the envelope's namespace", k)
				}
				if rows.Reason(k) == "" {
					forwarded = append(forwarded, k)
					if !slices.Equal(sent[k], []string{v}) {
						t.Fatalf("filter %d: row header %q: %q sent as %q", i, k, v, sent[k])
					}
				}
			}
			slices.Sort(forwarded)
			if want := append(forwarded, contractHeaders...); !slices.Equal(names, want) {
				t.Fatalf("filter %d: headers %q, want %q", i, names, want)
			}
		}
	})
}

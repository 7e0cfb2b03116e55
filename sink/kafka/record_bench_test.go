package kafka

import (
	"testing"

	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// BenchmarkRecord builds the record of an event with two row headers, the
// per-event work of Publish before the client takes over.
//
//	go test -run XXX -bench Record -benchmem ./sink/kafka/
func BenchmarkRecord(b *testing.B) {
	e := testEvent(1, "order", "order-1")
	e.Headers = map[string]string{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "tenant": "acme"}
	rows := sink.NewHeaderFilter(sink.KafkaRules, envelope.Kafka.ReservedPrefix(nil), nil)
	b.ReportAllocs()
	for b.Loop() {
		record(e, "outbox.order", rows)
	}
}

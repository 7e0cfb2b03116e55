package config

import (
	"strings"
	"testing"

	"github.com/outboxrelay/relay/event"
)

// TestDebeziumAccepts checks the default destinations with and without
// the format, an explicit template winning over them, and a Format built
// from Debezium's column names through outbox.columns.
func TestDebeziumAccepts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, topic, subject string }{
		{sinkCase("kafka", "  kafka:\n    brokers: [k:9092]\n"), "outbox.{aggregate_type}", "outbox.{aggregate_type}"},
		{sinkCase("kafka", "  format: native\n  kafka:\n    brokers: [k:9092]\n"), "outbox.{aggregate_type}", "outbox.{aggregate_type}"},
		{sinkCase("kafka", "  format: debezium\n  kafka:\n    brokers: [k:9092]\n"), "outbox.event.{aggregate_type}", "outbox.event.{aggregate_type}"},
		{sinkCase("kafka", "  format: debezium\n  kafka:\n    brokers: [k:9092]\n    topic: \"{aggregate_type}.events\"\n"), "{aggregate_type}.events", "outbox.event.{aggregate_type}"},
	} {
		c, err := Parse([]byte(tc.yaml), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Sink.Kafka.Topic != tc.topic || c.Sink.NATS.Subject != tc.subject {
			t.Errorf("topic %q subject %q, want %q %q", c.Sink.Kafka.Topic, c.Sink.NATS.Subject, tc.topic, tc.subject)
		}
	}
	yaml := "outbox:\n  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type}\n" +
		sinkCase("kafka", "  format: debezium\n  debezium:\n    expand_json_payload: true\n    key_converter: string\n"+
			"    additional_placement: [\"type:header:eventType,aggregatetype:envelope:aggType\", \"id:envelope\"]\n  kafka:\n    brokers: [k:9092]\n")
	c, err := Parse([]byte(yaml), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Format(c)
	if err != nil {
		t.Fatal(err)
	}
	e := f.Shape(&event.Event{ID: "e1", AggregateType: "order", AggregateID: "1", EventType: "OrderCreated",
		Payload: []byte(`{"a": 1}`), ContentType: event.ContentTypeJSON})
	if e.Key() != "1" || e.Headers["eventType"] != "OrderCreated" || e.Headers["id"] != "e1" ||
		string(e.Payload) != `{"payload":{"a":1},"aggType":"order","id":"e1"}` {
		t.Errorf("shaped: key %q headers %v value %s", e.Key(), e.Headers, e.Payload)
	}
	if c, err := Parse([]byte(minimal), env(nil)); err != nil {
		t.Fatal(err)
	} else if f, err := Format(c); f != nil || err != nil {
		t.Errorf("native: Format() = %v, %v", f, err)
	}
}

// TestDebeziumErrors: every mistake names the key and its line (the sink
// section is on line 5, the keys added to it start on line 7).
func TestDebeziumErrors(t *testing.T) {
	t.Parallel()
	const dbz = "  format: debezium\n  debezium:\n"
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"unknown format", "  format: avro\n", 7, "sink.format", `must be native or debezium, got "avro"`},
		{"settings without format", "  debezium:\n    expand_json_payload: true\n", 7, "sink.debezium", "has no effect unless sink.format is debezium"},
		{"with cloudevents", "  format: debezium\n  envelope: cloudevents\n  cloudevents:\n    source: urn:x\n", 7, "sink.format", "debezium and sink.envelope cloudevents exclude each other"},
		{"bad converter", dbz + "    key_converter: avro\n", 9, "sink.debezium.key_converter", `must be json or string, got "avro"`},
		{"unknown column", dbz + "    additional_placement: [\"type:header\"]\n", 9, "sink.debezium.additional_placement",
			`"type:header": column "type" is not one the relay reads and can place (aggregate_id, aggregate_type, event_type, id)`},
		{"partition", dbz + "    additional_placement: [\"aggregate_type:partition\"]\n", 9, "sink.debezium.additional_placement", "\"aggregate_type:partition\": the partition placement is not supported"},
		{"reserved header", dbz + "    additional_placement: [\"event_type:header\"]\n", 9, "sink.debezium.additional_placement", `header "event_type" is one the relay sets itself`},
		{"expand with string values", dbz + "    expand_json_payload: true\n    value_converter: string\n", 10, "sink.debezium.value_converter", "expanding the JSON payload and envelope placements need the json value converter"},
		{"nats control header", dbz + "    additional_placement: [\"event_type:header:Nats-Rollup\"]\n", 9, "sink.debezium.additional_placement", `header "Nats-Rollup" is one the nats sink does not forward`},
		{"webhook static id", dbz + "  webhook:\n    url: http://h/\n    headers:\n      ID: x\n", 12, "sink.webhook.headers.ID", "would override the ID header sink.format debezium sets"},
		{"twice one alias", dbz + "    additional_placement: [\"id:header:x,event_type:header:x\"]\n", 9, "sink.debezium.additional_placement", `two header placements are named "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ := "nats"
			if strings.Contains(tt.section, "webhook:") {
				typ = "webhook"
			}
			checkLoadError(t, sinkCase(typ, tt.section), tt.line, tt.key, tt.msg)
		})
	}
}

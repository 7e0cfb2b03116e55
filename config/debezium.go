package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/debezium"
)

// DebeziumDestination is the default destination template (sink.kafka.topic,
// sink.nats.subject) with sink.format debezium: the outbox event router's
// default route.topic.replacement, outbox.event.${routedByValue}, routed
// by the aggregate type.
const DebeziumDestination = "outbox.event.{aggregate_type}"

// Debezium tunes sink.format debezium, the message shape of Debezium's
// outbox event router. See docs/migrating-from-debezium.md.
type Debezium struct {
	// ExpandJSONPayload publishes a payload that is a JSON object as JSON
	// rather than as a JSON string, as the router's
	// table.expand.json.payload does. Default false.
	ExpandJSONPayload bool `yaml:"expand_json_payload"`
	// AdditionalPlacement is the router's table.fields.additional.placement:
	// items column:placement[:alias], comma-separated or one per list
	// entry, placement header or envelope, column one of the outbox
	// table's id, aggregate type, aggregate id, event type or order_by
	// columns (by the table's names). Default none.
	AdditionalPlacement []string `yaml:"additional_placement"`
	// KeyConverter is json (Kafka Connect's JsonConverter without
	// schemas: the key as a JSON string) or string (StringConverter: as
	// it is). Default json.
	KeyConverter string `yaml:"key_converter"`
	// ValueConverter is json (JsonConverter without schemas) or string
	// (StringConverter or BinaryDataConverter: the payload bytes as they
	// are). Default json.
	ValueConverter string `yaml:"value_converter"`
}

// defaultDestination returns the default destination template of the
// sinks that take one: DebeziumDestination with sink.format debezium,
// else outbox.{aggregate_type}.
func defaultDestination(s Sink) string {
	if s.Format == "debezium" {
		return DebeziumDestination
	}
	return "outbox.{aggregate_type}"
}

// Format returns the message format sink.format selects: nil for native,
// the Debezium format for debezium. It fails on settings the loader
// refuses too.
func Format(c *Config) (*debezium.Format, error) {
	if c.Sink.Format != "debezium" {
		return nil, nil
	}
	d := c.Sink.Debezium
	p, err := debezium.ParsePlacements(d.AdditionalPlacement, placeable(c.Outbox))
	if err != nil {
		return nil, err
	}
	return debezium.New(debezium.Options{ExpandJSON: d.ExpandJSONPayload, Placements: p,
		StringKey: d.KeyConverter == "string", StringValue: d.ValueConverter == "string"})
}

// placeable maps the outbox table's names of the columns a placement can
// copy to their fields.
func placeable(o Outbox) map[string]debezium.Field {
	m := map[string]debezium.Field{
		o.Column("id"): debezium.FieldID, o.Column("aggregate_type"): debezium.FieldAggregateType,
		o.Column("aggregate_id"): debezium.FieldAggregateID, o.Column("event_type"): debezium.FieldEventType,
	}
	if col := o.OrderColumn(); col != o.Column("aggregate_id") {
		m[col] = debezium.FieldOrderKey
	}
	return m
}

// checkFormat checks sink.format (empty means native) and, with debezium,
// sink.debezium; sink.debezium without that format is a mistake.
func (l *loader) checkFormat(c *Config) {
	s := c.Sink
	if _, set := l.lines["sink.format"]; set && !l.choice("sink.format", s.Format, "native", "debezium") {
		return
	}
	if s.Format != "debezium" {
		if _, set := l.lines["sink.debezium"]; set {
			l.invalid("sink.debezium", "has no effect unless sink.format is debezium")
		}
		return
	}
	if s.Envelope == "cloudevents" {
		l.invalid("sink.format", "debezium and sink.envelope cloudevents exclude each other: each shapes the message its own way")
	}
	l.converter("sink.debezium.key_converter", s.Debezium.KeyConverter)
	l.converter("sink.debezium.value_converter", s.Debezium.ValueConverter)
	p, err := debezium.ParsePlacements(s.Debezium.AdditionalPlacement, placeable(c.Outbox))
	if err != nil {
		l.invalid("sink.debezium.additional_placement", "%s", err)
		return
	}
	l.checkPlacedHeaders(p, c.Sink)
	if _, err := Format(c); err != nil {
		key := "sink.debezium.additional_placement"
		if s.Debezium.ValueConverter == "string" {
			key = "sink.debezium.value_converter"
		}
		l.invalid(key, "%s", err)
	}
}

// controlRules are the header rules of the sinks whose broker acts on
// some header names (sink.HeaderRules).
var controlRules = map[string]sink.HeaderRules{"nats": sink.NATSRules, "sqs": sink.SQSRules, "webhook": sink.HTTPRules}

// checkPlacedHeaders refuses a header placement that the sink would not
// forward (named like a header the relay sets itself, or one its broker
// acts on) and, on the webhook, a static header that would override the id
// header or a placed one.
func (l *loader) checkPlacedHeaders(p []debezium.Placement, s Sink) {
	names := []string{"id"}
	for _, pl := range p {
		if pl.Envelope {
			continue
		}
		names = append(names, pl.Name)
		switch {
		case slices.ContainsFunc(sink.RelayHeaders, func(n string) bool { return strings.EqualFold(n, pl.Name) }):
			l.invalid("sink.debezium.additional_placement", "header %q is one the relay sets itself (message_id, event_type, aggregate_type, aggregate_id, content_type and the sinks' own); choose another alias", pl.Name)
		case controlRules[s.Type].Control(pl.Name):
			l.invalid("sink.debezium.additional_placement", "header %q is one the %s sink does not forward, since its broker acts on it; choose another alias", pl.Name, s.Type)
		}
	}
	if s.Type != "webhook" {
		return
	}
	for _, name := range slices.Sorted(maps.Keys(s.Webhook.Headers)) {
		if slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, name) }) {
			l.invalid("sink.webhook.headers."+name, "would override the %s header sink.format debezium sets; remove it", name)
		}
	}
}

// converter checks a converter key when it is in the file: json or string.
func (l *loader) converter(key, value string) {
	if _, set := l.lines[key]; set {
		l.choice(key, value, "json", "string")
	}
}

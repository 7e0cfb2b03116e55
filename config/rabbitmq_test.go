package config

import (
	"strings"
	"testing"
)

// rabbitCase is a valid config with a rabbitmq sink whose keys are section,
// indented under sink.rabbitmq from line 8.
func rabbitCase(section string) string {
	return sinkCase("rabbitmq", "  rabbitmq:\n"+section)
}

func TestRabbitMQAccepts(t *testing.T) {
	c, err := Parse([]byte(rabbitCase("    url: amqp://relay:${RABBITMQ_PASSWORD}@127.0.0.1:5672/\n")), env(map[string]string{"RABBITMQ_PASSWORD": "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Sink.RabbitMQ
	if r.URL != "amqp://relay:pw@127.0.0.1:5672/" || r.Exchange != "outbox" || r.RoutingKey != "{aggregate_type}.{event_type}" || r.Declare {
		t.Errorf("defaults: %+v", r)
	}
	yaml := rabbitCase(`    url: amqps://relay:pw@mq.example.com/prod
    exchange: "events.{aggregate_type}"
    routing_key: "{event_type}"
    max_message_bytes: 1048576
    tls:
      enabled: true
`)
	if _, err := Parse([]byte(yaml), env(nil)); err != nil {
		t.Fatal(err)
	}
}

func TestRabbitMQErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"url missing", "    exchange: x\n", 7, "sink.rabbitmq.url", "required"},
		{"url scheme", "    url: http://h/\n", 8, "sink.rabbitmq.url", "AMQP scheme must be either 'amqp://' or 'amqps://'"},
		{"exchange chars", "    url: amqp://h/\n    exchange: \"a b\"\n", 9, "sink.rabbitmq.exchange", `template "a b": an exchange name holds only letters, digits`},
		{"exchange placeholder", "    url: amqp://h/\n    exchange: \"{id}\"\n", 9, "sink.rabbitmq.exchange", "template \"{id}\": unknown placeholder {id}"},
		{"routing key placeholder", "    url: amqp://h/\n    routing_key: \"{type}\"\n", 9, "sink.rabbitmq.routing_key", "template \"{type}\": unknown placeholder"},
		{"max message bytes", "    url: amqp://h/\n    max_message_bytes: -1\n", 9, "sink.rabbitmq.max_message_bytes", "must be at least 0"},
		{"exchange type", "    url: amqp://h/\n    exchange_type: x-delayed\n", 9, "sink.rabbitmq.exchange_type", "must be topic, direct, fanout or headers, got \"x-delayed\""},
		{"declare templated", "    url: amqp://h/\n    exchange: \"e.{aggregate_type}\"\n    declare: true\n", 10, "sink.rabbitmq.declare", "needs sink.rabbitmq.exchange to name one exchange"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkLoadError(t, rabbitCase(tt.section), tt.line, tt.key, tt.msg)
		})
	}
	// The password never shows in an error.
	_, err := parse("config.yaml", []byte(rabbitCase("    url: amqp://u:hunter2@h:notaport/\n")), env(nil))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("bad port: %v, want an error without the password", err)
	}
}

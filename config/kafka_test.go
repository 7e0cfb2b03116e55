package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// kafkaCase is a valid config with a kafka sink whose keys are section,
// indented under sink.kafka from line 8.
func kafkaCase(section string) string {
	return sinkCase("kafka", "  kafka:\n"+section)
}

func TestKafkaAccepts(t *testing.T) {
	yaml := kafkaCase(`    brokers: [kafka-1:9093, kafka-2:9093]
    topic: orders.{aggregate_type}-v1
    client_id: orders-relay
    partitions: 12
    replication_factor: 3
    tls:
      enabled: true
      ca_file: /etc/kafka/ca.pem
      cert_file: /etc/kafka/client.pem
      key_file: /etc/kafka/client.key
    sasl:
      mechanism: SCRAM-SHA-512
      username: relay
      password: ${KAFKA_PASSWORD}
`)
	c, err := Parse([]byte(yaml), env(map[string]string{"KAFKA_PASSWORD": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Kafka{
		Brokers:           []string{"kafka-1:9093", "kafka-2:9093"},
		Topic:             "orders.{aggregate_type}-v1",
		ClientID:          "orders-relay",
		Partitions:        12,
		ReplicationFactor: 3,
		TLS:               TLS{Enabled: true, CAFile: "/etc/kafka/ca.pem", CertFile: "/etc/kafka/client.pem", KeyFile: "/etc/kafka/client.key"},
		SASL:              KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "relay", Password: "s3cret"},
	}
	if !reflect.DeepEqual(c.Sink.Kafka, want) {
		t.Errorf("got  %+v\nwant %+v", c.Sink.Kafka, want)
	}

	c, err = Parse([]byte(kafkaCase("    brokers: [k:9092]\n")), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want = Kafka{Brokers: []string{"k:9092"}, Topic: "outbox.{aggregate_type}"}
	if !reflect.DeepEqual(c.Sink.Kafka, want) {
		t.Errorf("defaults: got %+v, want %+v", c.Sink.Kafka, want)
	}

	for _, section := range []string{
		"    brokers: [k]\n    tls: {enabled: true, insecure_skip_verify: true}\n",
		"    brokers: [k]\n    sasl: {mechanism: PLAIN, username: u, password: p}\n",
		"    brokers: [k]\n    topic: fixed_topic.v1\n",
		"    brokers: [k]\n    topic: \"{aggregate_type}\"\n",
		"    brokers: [k]\n    tls:\n      enabled: false\n",
	} {
		if _, err := Parse([]byte(kafkaCase(section)), env(nil)); err != nil {
			t.Errorf("%q: %v", section, err)
		}
	}
}

// TestKafkaIgnoredForOtherSinks checks that kafka keys are not validated
// when another sink is selected.
func TestKafkaIgnoredForOtherSinks(t *testing.T) {
	yaml := sinkCase("nats", "  kafka:\n    partitions: -1\n    sasl:\n      mechanism: GSSAPI\n")
	if _, err := Parse([]byte(yaml), env(nil)); err != nil {
		t.Fatal(err)
	}
}

func TestKafkaErrors(t *testing.T) {
	const brokers = "    brokers: [k:9092]\n"
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"topic characters", brokers + "    topic: out box.{aggregate_type}\n", 9, "sink.kafka.topic",
			`"out box.{aggregate_type}" has characters Kafka does not allow in a topic name (allowed: a-z A-Z 0-9 . _ -)`},
		{"topic slash", brokers + "    topic: a/b\n", 9, "sink.kafka.topic", `"a/b" has characters Kafka does not allow`},
		{"topic dot", brokers + "    topic: ..\n", 9, "sink.kafka.topic", `".." is not a valid topic name`},
		{"topic too long", brokers + "    topic: " + strings.Repeat("t", 250) + "\n", 9, "sink.kafka.topic", "longer than Kafka's 249 characters"},
		{"topic placeholder", brokers + "    topic: t.{type}\n", 9, "sink.kafka.topic", `template "t.{type}": unknown placeholder {type}`},
		{"partitions negative", brokers + "    partitions: -1\n", 9, "sink.kafka.partitions",
			"must be between 1 and 2147483647 (0 or unset: the broker's num.partitions), got -1"},
		{"partitions too many", brokers + "    partitions: 2147483648\n", 9, "sink.kafka.partitions", "must be between 1 and 2147483647"},
		{"partitions string", brokers + "    partitions: many\n", 9, "sink.kafka.partitions", `expected an integer, got "many"`},
		{"replication negative", brokers + "    replication_factor: -1\n", 9, "sink.kafka.replication_factor",
			"must be between 1 and 32767 (0 or unset: the broker's default.replication.factor), got -1"},
		{"replication too big", brokers + "    replication_factor: 40000\n", 9, "sink.kafka.replication_factor", "must be between 1 and 32767"},
		{"tls enabled string", brokers + "    tls:\n      enabled: yes please\n", 10, "sink.kafka.tls.enabled", "expected true or false"},
		{"tls unknown key", brokers + "    tls:\n      ca: x\n", 10, "sink.kafka.tls.ca",
			"unknown key (expected one of enabled, ca_file, cert_file, key_file, insecure_skip_verify)"},
		{"tls ca without enabled", brokers + "    tls:\n      ca_file: ca.pem\n", 10, "sink.kafka.tls.ca_file",
			"has no effect unless sink.kafka.tls.enabled is true"},
		{"tls skip verify without enabled", brokers + "    tls:\n      enabled: false\n      insecure_skip_verify: true\n", 11, "sink.kafka.tls.insecure_skip_verify",
			"has no effect unless sink.kafka.tls.enabled is true"},
		{"tls cert without key", brokers + "    tls:\n      enabled: true\n      cert_file: c.pem\n", 9, "sink.kafka.tls.key_file",
			"required (the client key of sink.kafka.tls.cert_file)"},
		{"tls key without cert", brokers + "    tls:\n      enabled: true\n      key_file: c.key\n", 9, "sink.kafka.tls.cert_file",
			"required (the client certificate of sink.kafka.tls.key_file)"},
		{"sasl mechanism unknown", brokers + "    sasl:\n      mechanism: GSSAPI\n      username: u\n      password: p\n", 10, "sink.kafka.sasl.mechanism",
			`must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM or OAUTHBEARER, got "GSSAPI"`},
		{"sasl mechanism lowercase", brokers + "    sasl:\n      mechanism: plain\n      username: u\n      password: p\n", 10, "sink.kafka.sasl.mechanism",
			`must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM or OAUTHBEARER, got "plain"`},
		{"sasl without mechanism", brokers + "    sasl:\n      username: u\n      password: p\n", 9, "sink.kafka.sasl.mechanism",
			"required (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM or OAUTHBEARER)"},
		{"sasl username missing", brokers + "    sasl:\n      mechanism: PLAIN\n      password: p\n", 9, "sink.kafka.sasl.username", "required"},
		{"sasl password empty", brokers + "    sasl:\n      mechanism: SCRAM-SHA-256\n      username: u\n      password: ${UNSET:-}\n", 12, "sink.kafka.sasl.password",
			"must not be empty (use ${VAR} to read it from the environment)"},
		{"sasl unknown key", brokers + "    sasl:\n      user: u\n", 10, "sink.kafka.sasl.user", "unknown key (expected one of mechanism, username, password, token_file)"},
		{"unknown kafka key", brokers + "    acks: 1\n", 9, "sink.kafka.acks",
			"unknown key (expected one of brokers, topic, client_id, partitions, replication_factor, tls, sasl, transactional, linger)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("config.yaml", []byte(kafkaCase(tt.section)), env(nil))
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			prefix := fmt.Sprintf("config.yaml:%d: ", tt.line)
			if tt.line == 0 {
				prefix = "config.yaml: "
			}
			want := prefix + tt.key + ": " + tt.msg
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("got  %q\nwant %q...", err, want)
			}
			var e *Error
			if !errors.As(err, &e) || e.Line != tt.line || e.Key != tt.key {
				t.Errorf("errors.As: got %+v", e)
			}
		})
	}
}

// TestKafkaErrorsHidePassword checks that no error about the SASL settings
// repeats the password.
func TestKafkaErrorsHidePassword(t *testing.T) {
	for _, section := range []string{
		"    brokers: [k]\n    sasl:\n      mechanism: SCRAM\n      username: u\n      password: s3cret\n",
		"    brokers: [k]\n    sasl:\n      username: u\n      password: s3cret\n",
		"    brokers: [k]\n    sasl:\n      mechanism: PLAIN\n      password: s3cret\n",
		"    brokers: [k]\n    sasl:\n      mechanism: PLAIN\n      username: u\n      password: [s3cret]\n",
		"    brokers: [k]\n    sasl:\n      mechanism: PLAIN\n      username: u\n      password: {s3cret}\n",
	} {
		_, err := Parse([]byte(kafkaCase(section)), env(nil))
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v", section, err)
		}
	}
}

package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// minimal is the smallest valid config. Cases append to it from line 7,
// either top-level sections or keys of capture.
const minimal = `postgres:
  url: postgres://app@localhost/app
sink:
  type: nats
capture:
  mode: poll
`

func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestLoadFull(t *testing.T) {
	c, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Postgres: Postgres{URL: "postgres://app:secret@127.0.0.1:5432/app?sslmode=disable", FatalAfter: Duration(2 * time.Minute), MaxConns: 12},
		Outbox: Outbox{Table: "events.outbox",
			Columns: map[string]string{"aggregate_id": "order_id", "created_at": "inserted_at"}},
		Capture: Capture{Mode: "wal", MaxBatchBytes: 4 << 20,
			Poll: Poll{Interval: Duration(250 * time.Millisecond), BatchSize: 1000, Partitions: 16},
			WAL:  WAL{Slot: "orders_relay", Publication: "orders_pub", Source: "table", MessagePrefix: "outbox"}},
		Sink: Sink{Type: "nats",
			NATS: NATS{URL: "nats://nats-1:4222,nats://nats-2:4222",
				Subject: "orders.{aggregate_type}.{event_type}", Stream: "ORDERS"},
			Kafka:    Kafka{Brokers: []string{"kafka-1:9092", "kafka-2:9092"}, Topic: "orders.{aggregate_type}"},
			RabbitMQ: RabbitMQ{Exchange: "outbox", RoutingKey: "{aggregate_type}.{event_type}"},
			SQS: SQS{Region: "eu-west-1", Endpoint: "http://127.0.0.1:9324",
				QueueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
				Queue:    "orders-{aggregate_type}"},
			Redis: Redis{URL: "redis://127.0.0.1:6379/0", Stream: "outbox.{aggregate_type}"},
			Webhook: Webhook{URL: "https://hooks.example.com/{aggregate_type}/{aggregate_id}",
				Timeout: Duration(2 * time.Second)}},
		Archive:         Archive{Mode: "move", Table: "events.outbox_archive"},
		Retry:           Retry{Initial: Duration(50 * time.Millisecond), Max: Duration(time.Minute), MaxAttempts: 5},
		DeadLetter:      DeadLetter{Table: "events.outbox_dead_letter"},
		HTTP:            HTTP{Listen: "127.0.0.1:9090"},
		Log:             Log{Format: "json", Level: "debug"},
		ShutdownTimeout: Duration(30 * time.Second),
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(minimal), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Postgres: Postgres{URL: "postgres://app@localhost/app", FatalAfter: Duration(5 * time.Minute), MaxConns: 8},
		Outbox:   Outbox{Table: "public.outbox"},
		Capture: Capture{Mode: "poll", MaxBatchBytes: 8 << 20,
			Poll: Poll{Interval: Duration(200 * time.Millisecond), BatchSize: 500, Partitions: 16},
			WAL:  WAL{Slot: "outbox_relay", Publication: "outbox_relay", Source: "table", MessagePrefix: "outbox"}},
		Sink: Sink{Type: "nats",
			NATS:     NATS{URL: "nats://127.0.0.1:4222", Subject: "outbox.{aggregate_type}", Stream: "OUTBOX"},
			Kafka:    Kafka{Topic: "outbox.{aggregate_type}"},
			RabbitMQ: RabbitMQ{Exchange: "outbox", RoutingKey: "{aggregate_type}.{event_type}"},
			Redis:    Redis{URL: "redis://127.0.0.1:6379/0", Stream: "outbox.{aggregate_type}"},
			Webhook:  Webhook{Timeout: Duration(5 * time.Second)}},
		Archive:         Archive{Mode: "delete", Table: "public.outbox_archive"},
		Retry:           Retry{Initial: Duration(100 * time.Millisecond), Max: Duration(30 * time.Second), MaxAttempts: 10},
		DeadLetter:      DeadLetter{Table: "public.outbox_dead_letter"},
		Log:             Log{Format: "text", Level: "info"},
		ShutdownTimeout: Duration(15 * time.Second),
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name, yaml string
		check      func(*Config) bool
	}{
		{"null sections keep defaults", minimal + "retry:\nlog: ~\n",
			func(c *Config) bool { return c.Retry.MaxAttempts == 10 && c.Log.Level == "info" }},
		{"zero values take defaults", minimal + "retry:\n  initial: 0s\n  max_attempts: 0\n",
			func(c *Config) bool { return c.Retry.Initial.D() == 100*time.Millisecond && c.Retry.MaxAttempts == 10 }},
		{"http.listen on all interfaces", minimal + "http:\n  listen: \":9090\"\n",
			func(c *Config) bool { return c.HTTP.Listen == ":9090" }},
		{"http.listen ipv6", minimal + "http:\n  listen: \"[::1]:0\"\n",
			func(c *Config) bool { return c.HTTP.Listen == "[::1]:0" }},
		{"http.advertise", minimal + "http:\n  listen: \":9090\"\n  advertise: relay-0.relay.prod.svc:9090\n",
			func(c *Config) bool { return c.HTTP.Advertise == "relay-0.relay.prod.svc:9090" }},
		{"scalars as strings", minimal + "dead_letter:\n  table: 9090\n",
			func(c *Config) bool { return c.DeadLetter.Table == "9090" }},
		{"merge key", minimal + "retry:\n  <<: {max_attempts: 3, initial: 1s}\n  max: 2s\n",
			func(c *Config) bool { return c.Retry.MaxAttempts == 3 && c.Retry.Max.D() == 2*time.Second }},
		{"anchor and alias", minimal + "archive:\n  table: &t events.archive\ndead_letter:\n  table: *t\n",
			func(c *Config) bool { return c.DeadLetter.Table == "events.archive" }},
		{"kafka sink", sinkCase("kafka", "  kafka:\n    brokers: [k:9092]\n"),
			func(c *Config) bool { return c.Sink.Kafka.Brokers[0] == "k:9092" }},
		{"sqs with queue template", sinkCase("sqs", "  sqs:\n    region: us-east-1\n    queue: q-{aggregate_type}\n"),
			func(c *Config) bool { return c.Sink.SQS.Queue == "q-{aggregate_type}" }},
		{"webhook sink", sinkCase("webhook", "  webhook:\n    url: \"http://h/{event_type}\"\n"),
			func(c *Config) bool { return c.Sink.Webhook.URL == "http://h/{event_type}" }},
		{"trailing document separator", minimal + "---\n",
			func(c *Config) bool { return c.Capture.Mode == "poll" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), env(nil))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	vars := env(map[string]string{"HOST": "db", "EMPTY": "", "PORT": "5433"})
	tests := []struct{ in, want string }{
		{"${HOST}", "db"},
		{"${UNSET}", ""},
		{"${UNSET:-localhost}", "localhost"},
		{"${EMPTY:-localhost}", "localhost"},
		{"${HOST:-localhost}", "db"},
		{"${PORT:-}", "5433"},
		{"postgres://u@${HOST}:${PORT:-5432}/app", "postgres://u@db:5433/app"},
		{"$$HOST and $${HOST}", "$HOST and ${HOST}"},
		{"a $ alone, $HOST, trailing $", "a $ alone, $HOST, trailing $"},
		{"${HOST\n}", "${HOST\n}"},
		{"${not-a-name} ${HOST}", "${not-a-name} db"},
		{"${HOST", "${HOST"},
	}
	for _, tt := range tests {
		if got := expandText(tt.in, vars); got != tt.want {
			t.Errorf("expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// expandText is the text data reads as when its references are replaced
// by their values.
func expandText(data string, lookupEnv func(string) (string, bool)) string {
	r, text := newRefs([]byte(data), lookupEnv)
	s, _ := r.expand(string(text))
	return s
}

func TestParseExpandsEnv(t *testing.T) {
	yaml := `postgres:
  url: postgres://app@${PGHOST}/app
capture:
  mode: ${MODE:-poll}
sink:
  type: nats
  nats:
    stream: ${STREAM:-EVENTS}
log:
  level: bogus
`
	_, err := Parse([]byte(yaml), env(map[string]string{"PGHOST": "db", "STREAM": "S"}))
	if err == nil || !strings.Contains(err.Error(), "line 10: log.level:") {
		t.Fatalf("expansion moved lines or hid the error: %v", err)
	}
	c, err := Parse([]byte(strings.Replace(yaml, "bogus", "info", 1)), env(map[string]string{"PGHOST": "db", "STREAM": "S"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.URL != "postgres://app@db/app" || c.Capture.Mode != "poll" || c.Sink.NATS.Stream != "S" {
		t.Errorf("unexpected config %+v", c)
	}
}

// sinkCase is a valid config with a sink of type typ, followed by section,
// which starts on line 7 inside sink.
func sinkCase(typ, section string) string {
	return "postgres:\n  url: postgres://app@localhost/app\ncapture:\n  mode: poll\nsink:\n  type: " + typ + "\n" + section
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		line       int // 0: the message must carry no line
		key, msg   string
	}{
		// Syntax.
		{"bad indentation", minimal + "retry:\n  initial: 1s\n   max: 2s\n", 8, "retry.initial", "invalid YAML: "},
		{"unclosed quote", minimal + "log:\n  level: 'info\n", 8, "log.level", "invalid YAML: could not find end character of single-quoted text"},
		{"duplicate key", minimal + "log:\n  level: info\n  level: warn\n", 9, "log.level", `invalid YAML: mapping key "level" already defined at [8:3]`},
		{"tab indentation", minimal + "log:\n\tlevel: info\n", 8, "log.level", "invalid YAML: found character"},
		{"two documents", minimal + "---\nlog: {}\n", 8, "", "only one YAML document is allowed"},
		{"unknown alias", minimal + "log:\n  level: *nope\n", 8, "log.level", "unknown alias *nope"},
		// Unknown keys.
		{"unknown top-level key", minimal + "retries:\n  max: 1s\n", 7, "retries", "unknown key (expected one of postgres, outbox, capture, sink, archive, retry, dead_letter, http, log, tracing, shutdown_timeout)"},
		{"unknown nested key", minimal + "retry:\n  maximum: 1s\n", 8, "retry.maximum", "unknown key (expected one of initial, max, max_attempts)"},
		{"unknown deep key", minimal + "  poll:\n    intervall: 1s\n", 8, "capture.poll.intervall", "unknown key (expected one of interval, linger, batch_size, partitions, notify)"},
		// Types.
		{"string for integer", minimal + "  poll:\n    batch_size: abc\n", 8, "capture.poll.batch_size", `expected an integer, got "abc"`},
		{"float for integer", minimal + "retry:\n  max_attempts: 1.5\n", 8, "retry.max_attempts", "expected an integer, got 1.5"},
		{"huge integer", minimal + "retry:\n  max_attempts: 99999999999999999999\n", 8, "retry.max_attempts", "expected an integer, got"},
		{"list for string", minimal + "log:\n  level: [info]\n", 8, "log.level", "expected a string, got a list"},
		{"unquoted braces", minimal + "dead_letter:\n  table: {aggregate_type}\n", 8, "dead_letter.table", `expected a string, got a mapping (quote a value that starts with "{")`},
		{"string for list", sinkCase("kafka", "  kafka:\n    brokers: k:9092\n"), 8, "sink.kafka.brokers", "expected a list, got a string"},
		{"string for mapping", minimal + "retry: fast\n", 7, "retry", "expected a mapping, got a string"},
		{"integer for mapping", minimal + "  poll: 5\n", 7, "capture.poll", "expected a mapping, got an integer"},
		{"list for map", minimal + "outbox:\n  columns: [id]\n", 8, "outbox.columns", "expected a mapping, got a list"},
		{"not a mapping at all", "- postgres\n", 1, "", "expected a mapping, got a list"},
		// Durations.
		{"bad duration", minimal + "  poll:\n    interval: 10 seconds\n", 8, "capture.poll.interval", `invalid duration "10 seconds" (use Go durations like 250ms or 10s)`},
		{"integer duration", minimal + "shutdown_timeout: 10\n", 7, "shutdown_timeout", "invalid duration 10 (use Go durations like 250ms or 10s)"},
		{"negative duration", minimal + "retry:\n  initial: -1s\n", 8, "retry.initial", `invalid duration "-1s" (must not be negative)`},
		// Required values.
		{"postgres.url missing", "capture:\n  mode: poll\nsink:\n  type: nats\n", 0, "postgres.url", "required"},
		{"postgres.url empty", strings.Replace(minimal, "postgres://app@localhost/app", "${UNSET:-}", 1), 2, "postgres.url", "must not be empty"},
		{"capture.mode missing", "postgres:\n  url: x\nsink:\n  type: nats\n", 0, "capture.mode", "required (wal or poll)"},
		{"capture.mode wrong", strings.Replace(minimal, "mode: poll", "mode: wall", 1), 6, "capture.mode", `must be wal or poll, got "wall"`},
		{"sink.type missing", "postgres:\n  url: x\ncapture:\n  mode: wal\n", 0, "sink.type", "required (kafka, nats, pubsub, rabbitmq, redis, sqs or webhook)"},
		{"sink.type wrong", sinkCase("mqtt", ""), 6, "sink.type", `must be kafka, nats, pubsub, rabbitmq, redis, sqs or webhook, got "mqtt"`},
		{"kafka brokers missing", sinkCase("kafka", ""), 5, "sink.kafka.brokers", "required (a list of host:port)"},
		{"kafka brokers empty", sinkCase("kafka", "  kafka:\n    brokers: []\n"), 8, "sink.kafka.brokers", "must not be empty (a list of host:port)"},
		{"kafka broker empty", sinkCase("kafka", "  kafka:\n    brokers:\n      - k:9092\n      - \"\"\n"), 10, "sink.kafka.brokers[1]", "must not be empty"},
		{"pubsub max_publishers negative", sinkCase("pubsub", "  pubsub:\n    project_id: p\n    topic: tpc\n    max_publishers: -1\n"), 10, "sink.pubsub.max_publishers", "must be positive, got -1"},
		{"sqs region missing", sinkCase("sqs", "  sqs:\n    queue_url: http://q\n"), 7, "sink.sqs.region", "required"},
		{"sqs no queue", sinkCase("sqs", "  sqs:\n    region: r\n"), 7, "sink.sqs.queue_url", "required (or sink.sqs.queue, a queue name template)"},
		{"sqs both queues", sinkCase("sqs", "  sqs:\n    region: r\n    queue_url: http://q\n    queue: q\n"), 10, "sink.sqs.queue", "set either sink.sqs.queue_url or sink.sqs.queue, not both"},
		{"webhook url missing", sinkCase("webhook", "  webhook:\n    timeout: 1s\n"), 7, "sink.webhook.url", "required"},
		{"sqs role_arn not a role", sinkCase("sqs", "  sqs:\n    region: r\n    queue: q\n    role_arn: arn:aws:iam::123:user/x\n"), 10, "sink.sqs.role_arn", `must be an IAM role ARN like arn:aws:iam::123456789012:role/outbox-relay, got "arn:aws:iam::123:user/x"`},
		{"sqs external_id without role", sinkCase("sqs", "  sqs:\n    region: r\n    queue: q\n    external_id: e-1\n"), 10, "sink.sqs.external_id", "has no effect without sink.sqs.role_arn"},
		{"sqs role_session_name bad", sinkCase("sqs", "  sqs:\n    region: r\n    queue: q\n    role_arn: arn:aws-cn:iam::123456789012:role/a/b\n    role_session_name: a b\n"), 11, "sink.sqs.role_session_name", `must be 2 to 64 characters of letters, digits and +=,.@_-, got "a b"`},
		// Choices, ranges and names.
		{"archive.mode", minimal + "archive:\n  mode: keep\n", 8, "archive.mode", `must be delete, mark, move or partition, got "keep"`},
		{"log.format", minimal + "log:\n  format: xml\n", 8, "log.format", `must be text or json, got "xml"`},
		{"log.level", minimal + "log:\n  level: trace\n", 8, "log.level", `must be debug, info, warn or error, got "trace"`},
		{"max_conns too small", strings.Replace(minimal, "/app\n", "/app\n  max_conns: 1\n", 1), 3, "postgres.max_conns", "must be at least 2, got 1"},
		{"batch_size negative", minimal + "  poll:\n    batch_size: -1\n", 8, "capture.poll.batch_size", "must be between 1 and 100000, got -1"},
		{"batch_size too big", minimal + "  poll:\n    batch_size: 100001\n", 8, "capture.poll.batch_size", "must be between 1 and 100000, got 100001"},
		{"max_batch_bytes too small", minimal + "  max_batch_bytes: 1000\n", 7, "capture.max_batch_bytes", "must be between 65536 (64 KiB) and 1073741824 (1 GiB), got 1000"},
		{"retry.max below initial", minimal + "retry:\n  initial: 2s\n  max: 1s\n", 9, "retry.max", "must be at least retry.initial (2s), got 1s"},
		{"retry.max below default initial", minimal + "retry:\n  max: 10ms\n", 8, "retry.max", "must be at least retry.initial (100ms), got 10ms"},
		{"max_attempts", minimal + "retry:\n  max_attempts: -3\n", 8, "retry.max_attempts", "must be at least 1, got -3"},
		{"unknown column", minimal + "outbox:\n  columns:\n    kind: type\n", 9, "outbox.columns.kind", "unknown column (expected one of id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq)"},
		{"empty column", minimal + "outbox:\n  columns:\n    seq: \"\"\n", 9, "outbox.columns.seq", "must not be empty (the table's column name)"},
		{"outbox.table", minimal + "outbox:\n  table: a.b.c\n", 8, "outbox.table", `must be "name" or "schema.name", got "a.b.c"`},
		{"archive.table", minimal + "archive:\n  table: .x\n", 8, "archive.table", `must be "name" or "schema.name", got ".x"`},
		{"dead_letter.table", minimal + "dead_letter:\n  table: x.\n", 8, "dead_letter.table", `must be "name" or "schema.name", got "x."`},
		{"dead_letter.table is the outbox", minimal + "dead_letter:\n  table: public.outbox\n", 8, "dead_letter.table", "must not be the outbox table (public.outbox)"},
		{"dead_letter.table is the outbox unqualified", minimal + "outbox:\n  table: events\ndead_letter:\n  table: public.events\n", 10, "dead_letter.table", "must not be the outbox table (events)"},
		{"dead_letter.table is the archive", minimal + "archive:\n  mode: move\n  table: app.kept\ndead_letter:\n  table: app.kept\n", 11, "dead_letter.table", "must not be the archive table (app.kept)"},
		{"archive.table is the outbox", minimal + "archive:\n  mode: move\n  table: outbox\n", 9, "archive.table", "must not be the outbox table (public.outbox)"},
		{"nats.subject", sinkCase("nats", "  nats:\n    subject: outbox.{type}\n"), 8, "sink.nats.subject", `template "outbox.{type}": unknown placeholder {type} (allowed: {aggregate_type}, {event_type}, {aggregate_id})`},
		{"kafka.topic", sinkCase("kafka", "  kafka:\n    brokers: [k]\n    topic: t.{x}\n"), 9, "sink.kafka.topic", `template "t.{x}": unknown placeholder {x}`},
		{"sqs.queue", sinkCase("sqs", "  sqs:\n    region: r\n    queue: q-{id}\n"), 9, "sink.sqs.queue", `template "q-{id}": unknown placeholder {id}`},
		{"webhook.url", sinkCase("webhook", "  webhook:\n    url: https://u:tok@h/{id}\n"), 8, "sink.webhook.url", `template "https://xxxxx@h/{id}": unknown placeholder {id}`},
		{"unclosed placeholder", sinkCase("nats", "  nats:\n    subject: outbox.{aggregate_type\n"), 8, "sink.nats.subject", `template "outbox.{aggregate_type": unclosed {`},
		{"wal slot", minimal + "  wal:\n    slot: Orders-Relay\n", 8, "capture.wal.slot", `must match ^[a-z0-9_]{1,63}$ (lowercase letters, digits and _), got "Orders-Relay"`},
		{"http.listen port only", minimal + "http:\n  listen: 9090\n", 8, "http.listen", `must be host:port, e.g. 127.0.0.1:9090 or :9090, got "9090"`},
		{"http.listen bad port", minimal + "http:\n  listen: localhost:http-alt\n", 8, "http.listen", `must be host:port, e.g. 127.0.0.1:9090 or :9090, got "localhost:http-alt"`},
		{"http.listen port too big", minimal + "http:\n  listen: 127.0.0.1:70000\n", 8, "http.listen", "must be host:port"},
		{"http.advertise without a host", minimal + "http:\n  listen: \":9090\"\n  advertise: \":9090\"\n", 9, "http.advertise", "must be host:port with a host"},
		{"http.advertise too long", minimal + "http:\n  listen: \":9090\"\n  advertise: " + strings.Repeat("h", 50) + ":9090\n", 9, "http.advertise", "must be host:port with a host, a port from 1 to 65535 and at most 50 bytes"},
		{"http.advertise without http.listen", minimal + "http:\n  advertise: relay-0:9090\n", 8, "http.advertise", "needs http.listen"},
		{"park_aggregate in wal mode", strings.Replace(minimal, "mode: poll", "mode: wal", 1) + "dead_letter:\n  park_aggregate: true\n", 8, "dead_letter.park_aggregate", "is not offered in wal mode"},
		{"missing key in a present section", minimal + "retry:\n  initial: 1m\n", 7, "retry.max", "must be at least retry.initial (1m0s), got 30s"},
		{"table name too long", minimal + "outbox:\n  table: s." + strings.Repeat("t", 64) + "\n", 8, "outbox.table", "a name is longer than PostgreSQL's 63 bytes"},
		{"column name too long", minimal + "outbox:\n  columns:\n    seq: " + strings.Repeat("c", 64) + "\n", 9, "outbox.columns.seq", "longer than PostgreSQL's 63 bytes"},
		{"fatal_after too short", "postgres:\n  url: x\n  fatal_after: 10ms\ncapture:\n  mode: poll\nsink:\n  type: nats\n", 3, "postgres.fatal_after", "must be at least 1s, got 10ms"},
		{"wal slot too long", minimal + "  wal:\n    slot: " + strings.Repeat("s", 64) + "\n", 8, "capture.wal.slot", "must match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("config.yaml", []byte(tt.yaml), env(nil))
			if err == nil {
				t.Fatal("no error")
			}
			t.Log(err)
			prefix := fmt.Sprintf("config.yaml:%d: ", tt.line)
			if tt.line == 0 {
				prefix = "config.yaml: "
			}
			if tt.key != "" {
				prefix += tt.key + ": "
			}
			if !strings.HasPrefix(err.Error(), prefix+tt.msg) {
				t.Errorf("got  %q\nwant %q...", err, prefix+tt.msg)
			}
			var e *Error
			if !errors.As(err, &e) || e.Line != tt.line || e.Key != tt.key {
				t.Errorf("errors.As: got %+v", e)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.yaml: cannot read the config file: no such file") {
		t.Errorf("missing file: %v", err)
	}

	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(minimal+"log:\n  level: loud\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if !errors.As(err, &e) || err.Error() != path+`:8: log.level: must be debug, info, warn or error, got "loud"` {
		t.Errorf("bad file: %v", err)
	}
}

func TestErrorsAreJoined(t *testing.T) {
	yaml := "postgres:\n  uri: x\ncapture:\n  mode: poll\n  poll:\n    interval: soon\n"
	_, err := parse("config.yaml", []byte(yaml), env(nil))
	want := "config.yaml:2: postgres.uri: unknown key (expected one of url, password, password_file, fatal_after, max_conns, aws_iam_auth)\n" +
		`config.yaml:6: capture.poll.interval: invalid duration "soon" (use Go durations like 250ms or 10s)` + "\n" +
		"config.yaml:1: postgres.url: required\n" +
		"config.yaml: sink.type: required (kafka, nats, pubsub, rabbitmq, redis, sqs or webhook)"
	if err == nil || err.Error() != want {
		t.Errorf("decode errors: got\n%v\nwant\n%s", err, want)
	}

	// A value that fails to decode does not hide the validation errors of
	// other keys, and is not reported twice.
	yaml = "postgres:\n  url: postgres://app@db/app\ncapture:\n  mode: sometimes\nsink:\n  type: webhook\n  webhook:\n" +
		"    url: ftp://example.com/hook\n    timeout: 10 seconds\n"
	_, err = parse("config.yaml", []byte(yaml), env(nil))
	want = `config.yaml:9: sink.webhook.timeout: invalid duration "10 seconds" (use Go durations like 250ms or 10s)` + "\n" +
		`config.yaml:4: capture.mode: must be wal or poll, got "sometimes"` + "\n" +
		"config.yaml:8: sink.webhook.url: "
	if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), "\n") != 2 {
		t.Errorf("decode and validation errors: got\n%v\nwant\n%s...", err, want)
	}

	yaml = "capture:\n  mode: both\nlog:\n  level: loud\n"
	_, err = parse("config.yaml", []byte(yaml), env(nil))
	want = "config.yaml: postgres.url: required\n" +
		`config.yaml:2: capture.mode: must be wal or poll, got "both"` + "\n" +
		"config.yaml: sink.type: required (kafka, nats, pubsub, rabbitmq, redis, sqs or webhook)\n" +
		`config.yaml:4: log.level: must be debug, info, warn or error, got "loud"`
	if err == nil || err.Error() != want {
		t.Errorf("validation errors: got\n%v\nwant\n%s", err, want)
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		err  Error
		want string
	}{
		{Error{File: "c.yaml", Line: 3, Key: "log.level", Msg: "bad"}, "c.yaml:3: log.level: bad"},
		{Error{File: "c.yaml", Key: "postgres.url", Msg: "required"}, "c.yaml: postgres.url: required"},
		{Error{Line: 3, Key: "log.level", Msg: "bad"}, "line 3: log.level: bad"},
		{Error{File: "c.yaml", Line: 1, Msg: "bad"}, "c.yaml:1: bad"},
		{Error{Msg: "bad"}, "bad"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestErrorsHidePostgresURL(t *testing.T) {
	const url = "postgres://app:s3cr3t@db/app"
	tests := []string{
		"postgres: " + url + "\n",
		"postgres:\n  url: [" + url + "]\n",
		"postgres:\n  url: '" + url + "\n",
		"postgres:\n  url: " + url + "\n  url: " + url + "\n",
		"postgres:\n  url: " + url + "\n   bad: indent\n",
		"postgres:\n  url: {" + url + "}\n",
	}
	for _, yaml := range tests {
		_, err := Parse([]byte(yaml), env(nil))
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: %v", yaml, err)
		}
	}
}

func TestColumn(t *testing.T) {
	o := Outbox{Columns: map[string]string{"aggregate_id": "order_id"}}
	for name, want := range map[string]string{"aggregate_id": "order_id", "seq": "seq", "id": "id"} {
		if got := o.Column(name); got != want {
			t.Errorf("Column(%q) = %q, want %q", name, got, want)
		}
	}
	if got := (Outbox{}).Column("payload"); got != "payload" {
		t.Errorf("Column without mapping = %q", got)
	}
}

// Package config loads the relay's YAML configuration file into typed,
// validated structs. See ../shared/CONTRACT.md §2 and docs/configuration.md.
package config

import "time"

// Config is the whole configuration file. Zero values are replaced by the
// defaults documented on each field when the file is loaded.
type Config struct {
	Postgres   Postgres   `yaml:"postgres"`
	Outbox     Outbox     `yaml:"outbox"`
	Capture    Capture    `yaml:"capture"`
	Sink       Sink       `yaml:"sink"`
	Archive    Archive    `yaml:"archive"`
	Retry      Retry      `yaml:"retry"`
	DeadLetter DeadLetter `yaml:"dead_letter"`
	HTTP       HTTP       `yaml:"http"`
	Log        Log        `yaml:"log"`
	// ShutdownTimeout bounds how long SIGINT/SIGTERM waits for in-flight
	// publishes and archiving before exiting. Default 15s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
}

// Postgres says how to reach the database.
type Postgres struct {
	// URL is a libpq connection URL or key=value string. Required.
	URL string `yaml:"url"`
}

// Outbox names the outbox table and its columns.
type Outbox struct {
	// Table is the outbox table, optionally schema-qualified. Default
	// public.outbox.
	Table string `yaml:"table"`
	// Columns remaps contract column names (id, aggregate_type, aggregate_id,
	// event_type, payload, headers, created_at, seq) to the table's names.
	Columns map[string]string `yaml:"columns"`
}

// Capture selects and tunes the capture mode.
type Capture struct {
	// Mode is "wal" or "poll". Required.
	Mode string `yaml:"mode"`
	Poll Poll   `yaml:"poll"`
	WAL  WAL    `yaml:"wal"`
}

// Poll tunes poll capture.
type Poll struct {
	// Interval is the longest wait between polls when the outbox is idle.
	// Default 200ms.
	Interval Duration `yaml:"interval"`
	// BatchSize is the most rows claimed by one poll. Default 500.
	BatchSize int `yaml:"batch_size"`
	// Partitions is how many partitions (by hash of aggregate_id) relays
	// running against one outbox share between them; every relay on one
	// outbox must use the same value. Default 16.
	Partitions int `yaml:"partitions"`
}

// WAL tunes logical replication capture.
type WAL struct {
	// Slot is the logical replication slot, created if missing. Default
	// outbox_relay.
	Slot string `yaml:"slot"`
	// Publication is the publication, created if missing. Default
	// outbox_relay.
	Publication string `yaml:"publication"`
}

// Sink selects and configures the broker.
type Sink struct {
	// Type is kafka, nats, sqs or webhook. Required.
	Type    string  `yaml:"type"`
	NATS    NATS    `yaml:"nats"`
	Kafka   Kafka   `yaml:"kafka"`
	SQS     SQS     `yaml:"sqs"`
	Webhook Webhook `yaml:"webhook"`
}

// NATS configures the NATS JetStream sink.
type NATS struct {
	// URL of the NATS server(s), comma separated. Default nats://127.0.0.1:4222.
	URL string `yaml:"url"`
	// Subject is the subject template. Default outbox.{aggregate_type}.
	Subject string `yaml:"subject"`
	// Stream is the JetStream stream, created if missing. Default OUTBOX.
	Stream string `yaml:"stream"`
}

// Kafka configures the Kafka sink.
type Kafka struct {
	// Brokers are the seed brokers. Required for the kafka sink.
	Brokers []string `yaml:"brokers"`
	// Topic is the topic template. Default outbox.{aggregate_type}.
	Topic string `yaml:"topic"`
}

// SQS configures the SQS sink.
type SQS struct {
	// Region is the AWS region. Required for the sqs sink.
	Region string `yaml:"region"`
	// Endpoint overrides the SQS endpoint (emulators, VPC endpoints).
	Endpoint string `yaml:"endpoint"`
	// QueueURL is one fixed queue. Exactly one of QueueURL and Queue is set.
	QueueURL string `yaml:"queue_url"`
	// Queue is a queue name template resolved with GetQueueUrl.
	Queue string `yaml:"queue"`
}

// Webhook configures the webhook sink.
type Webhook struct {
	// URL is the URL template events are POSTed to. Required for the
	// webhook sink.
	URL string `yaml:"url"`
	// Timeout bounds one request. Default 5s.
	Timeout Duration `yaml:"timeout"`
}

// Archive says what happens to a row once its publish was acknowledged.
type Archive struct {
	// Mode is delete, mark or move. Default delete.
	Mode string `yaml:"mode"`
	// Table is the archive table for move. Default public.outbox_archive.
	Table string `yaml:"table"`
}

// Retry sets the backoff for failed publishes.
type Retry struct {
	// Initial is the first backoff. Default 100ms.
	Initial Duration `yaml:"initial"`
	// Max caps the backoff. Default 30s.
	Max Duration `yaml:"max"`
	// MaxAttempts is how many failed attempts dead-letter an event.
	// Default 10.
	MaxAttempts int `yaml:"max_attempts"`
}

// DeadLetter configures the dead-letter table. After an event is
// dead-lettered, its aggregate continues with its next event.
type DeadLetter struct {
	// Table is the dead-letter table. Default public.outbox_dead_letter.
	Table string `yaml:"table"`
}

// HTTP configures the metrics and health endpoint.
type HTTP struct {
	// Listen is the address of /metrics, /healthz and /readyz; empty
	// disables the server.
	Listen string `yaml:"listen"`
}

// Log configures logging.
type Log struct {
	// Format is text or json. Default text.
	Format string `yaml:"format"`
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level"`
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

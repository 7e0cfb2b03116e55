package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/debezium"
	"github.com/outboxrelay/relay/sink/envelope"
	kafkasink "github.com/outboxrelay/relay/sink/kafka"
	natssink "github.com/outboxrelay/relay/sink/nats"
	pubsubsink "github.com/outboxrelay/relay/sink/pubsub"
	rabbitmqsink "github.com/outboxrelay/relay/sink/rabbitmq"
	redissink "github.com/outboxrelay/relay/sink/redis"
	sqssink "github.com/outboxrelay/relay/sink/sqs"
	"github.com/outboxrelay/relay/sink/webhook"
)

// routedSink is a sink that names each event's destination and probes
// destinations while idle; every broker sink is one.
type routedSink interface {
	sink.Sink
	sink.Destinations
}

// brokerSink is a sink with what init, run and check need of it.
type brokerSink struct {
	routedSink
	// name says which broker, without credentials, for messages.
	name string
	// prepare creates what the sink needs and is missing (NATS stream, a
	// fixed Kafka topic) and describes the result in one line.
	prepare func(ctx context.Context) (string, error)
	// check verifies the broker is reachable and set up; errors carry the fix.
	check func(ctx context.Context) error
	// drops counts the row headers the sink does not forward.
	drops *sink.HeaderDrops
	// runBreaks counts the Kafka sink's broken runs (kafka.Sink.RunBreaks);
	// nil for the other sinks.
	runBreaks func() int64
	// format shapes every event before the sink publishes it
	// (sink.format); nil for native.
	format *debezium.Format
}

// Publish publishes batch with the wrapped sink, each event shaped by
// sink.format first unless it is native.
func (b *brokerSink) Publish(ctx context.Context, batch []*event.Event) error {
	if b.format != nil {
		batch = b.format.Batch(batch)
	}
	return b.routedSink.Publish(ctx, batch)
}

// MaxPerAggregate implements sink.Ordered for the pipeline: the wrapped
// sink's value, or 1 (one event of an aggregate per publish) when it does
// not implement it.
func (b *brokerSink) MaxPerAggregate() int {
	if o, ok := b.routedSink.(sink.Ordered); ok {
		return o.MaxPerAggregate()
	}
	return 1
}

// RowChosen implements sink.RowRouted with the wrapped sink's answer.
func (b *brokerSink) RowChosen() bool { return sink.RowChosen(b.routedSink) }

// openSink connects the sink cfg.Sink.Type selects. window is the
// pipeline's in-flight window, for sinks that buffer.
func openSink(ctx context.Context, cfg *config.Config, log *slog.Logger, window int) (*brokerSink, error) {
	env, err := cloudEvents(cfg.Sink)
	if err != nil {
		return nil, err
	}
	format, err := config.Format(cfg)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("sink.debezium: %w", err)}
	}
	drops := sink.NewHeaderDrops(log)
	snk, err := openBroker(ctx, cfg.Sink, log, window, env, drops, transactionalID(cfg))
	if err != nil {
		return nil, err
	}
	snk.drops, snk.format = drops, format
	return snk, nil
}

// openBroker connects the sink c.Type selects, counting the row headers it
// drops in drops; txnID is Kafka's transactional id (transactionalID).
func openBroker(ctx context.Context, c config.Sink, log *slog.Logger, window int, env *envelope.CloudEvents, drops *sink.HeaderDrops, txnID string) (*brokerSink, error) {
	switch c.Type {
	case "nats":
		s, err := natssink.New(ctx, natsConfig(c.NATS), natssink.Options{Logger: log, Envelope: env, HeaderDrops: drops})
		if err != nil {
			return nil, err
		}
		return &brokerSink{routedSink: s, name: "nats " + redact.String(c.NATS.URL), check: s.Check,
			prepare: func(ctx context.Context) (string, error) {
				return "nats: stream " + c.NATS.Stream + " ready", s.EnsureStream(ctx)
			}}, nil
	case "kafka":
		s, err := kafkasink.New(ctx, kafkaConfig(c.Kafka, txnID), kafkasink.Options{Logger: log, MaxBufferedRecords: window, Envelope: env, HeaderDrops: drops,
			Linger: c.Kafka.Linger.D()})
		if err != nil {
			return nil, err
		}
		return &brokerSink{routedSink: s, name: "kafka " + strings.Join(c.Kafka.Brokers, ","), check: s.Check,
			prepare:   func(ctx context.Context) (string, error) { return kafkaTopics(ctx, s, c.Kafka.Topic) },
			runBreaks: s.RunBreaks}, nil
	case "sqs":
		s, err := sqssink.New(ctx, sqsConfig(c.SQS), sqssink.Options{Logger: log, Envelope: env, HeaderDrops: drops})
		if err != nil {
			return nil, err
		}
		return &brokerSink{routedSink: s, name: "sqs " + s.Destination(), check: s.Check,
			prepare: func(context.Context) (string, error) {
				return "sqs: the relay creates no queues; create " + s.Destination() + " if missing", nil
			}}, nil
	case "pubsub":
		return openPubSub(ctx, c, log, env, drops)
	case "rabbitmq":
		s, err := rabbitmqsink.New(rabbitmqConfig(c.RabbitMQ), rabbitmqsink.Options{Logger: log, Envelope: env, HeaderDrops: drops})
		if err != nil {
			return nil, err
		}
		return &brokerSink{routedSink: s, name: s.Destination(), check: s.Check, prepare: s.Declare}, nil
	case "redis":
		s, err := redissink.New(redisConfig(c.Redis), redissink.Options{Logger: log, Envelope: env, HeaderDrops: drops})
		if err != nil {
			return nil, &UsageError{Err: err}
		}
		return &brokerSink{routedSink: s, name: s.Destination(), check: s.Check,
			prepare: func(ctx context.Context) (string, error) {
				return "redis: nothing to create; XADD creates each stream on its first entry", s.Ping(ctx)
			}}, nil
	case "webhook":
		s, err := webhook.New(webhookConfig(c.Webhook), webhook.Options{Logger: log, Envelope: env, HeaderDrops: drops})
		if err != nil {
			return nil, err
		}
		return &brokerSink{routedSink: s, name: "webhook " + s.URL(), check: s.Check,
			prepare: func(context.Context) (string, error) { return "webhook: nothing to create", nil }}, nil
	}
	return nil, &UsageError{Err: fmt.Errorf("sink.type %q is not supported", c.Type)}
}

// pubsubConfig maps the sink.pubsub keys to the sink's config and options.
func pubsubConfig(p config.PubSub) (pubsubsink.Config, pubsubsink.Options) {
	return pubsubsink.Config{ProjectID: p.ProjectID, Topic: p.Topic, CredentialsFile: p.CredentialsFile, Endpoint: p.Endpoint},
		pubsubsink.Options{PublishTimeout: p.PublishTimeout.D(), BatchDelay: p.BatchDelay.D(), MaxPublishers: p.MaxPublishers}
}

// openPubSub connects the Pub/Sub sink of c.PubSub; prepare creates a
// missing fixed topic.
func openPubSub(ctx context.Context, c config.Sink, log *slog.Logger, env *envelope.CloudEvents, drops *sink.HeaderDrops) (*brokerSink, error) {
	if env != nil {
		return nil, &UsageError{Err: fmt.Errorf("sink.envelope: cloudevents is not supported with sink.type pubsub")}
	}
	cfg, opts := pubsubConfig(c.PubSub)
	opts.Logger, opts.HeaderDrops = log, drops
	s, err := pubsubsink.New(ctx, cfg, opts)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	return &brokerSink{routedSink: s, name: s.Destination(), check: s.Check,
		prepare: func(ctx context.Context) (string, error) {
			created, err := s.EnsureTopic(ctx)
			switch t := s.FixedTopic(); {
			case err != nil:
				return "", err
			case t == "":
				return "pubsub: the topics of " + cfg.Topic + " cannot be known ahead; create them before events reach them", nil
			case created:
				return "pubsub: topic " + t + " created", nil
			default:
				return "pubsub: topic " + t + " exists", nil
			}
		}}, nil
}

// cloudEvents returns the envelope sink.envelope selects: nil for none.
func cloudEvents(c config.Sink) (*envelope.CloudEvents, error) {
	if c.Envelope != "cloudevents" {
		return nil, nil
	}
	env, err := envelope.New(c.CloudEvents.Source)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("sink.cloudevents.source: %w", err)}
	}
	return env, nil
}

// natsConfig maps sink.nats to the NATS sink's settings.
func natsConfig(c config.NATS) natssink.Config {
	return natssink.Config{
		URL: c.URL, Subject: c.Subject, Stream: c.Stream,
		Auth: natssink.Auth{CredentialsFile: c.CredentialsFile, NKeyFile: c.NKeyFile,
			Username: c.Username, Password: c.Password, Token: c.Token},
		TLS: tlsconf.Files(c.TLS),
		StreamSettings: natssink.StreamSettings{Replicas: c.Replicas, Memory: c.Storage == "memory",
			MaxAge: c.MaxAge.D(), MaxBytes: int64(c.MaxBytes), MaxMsgs: int64(c.MaxMsgs),
			DuplicateWindow: c.DuplicateWindow.D()},
	}
}

// kafkaConfig maps sink.kafka to the Kafka sink's settings, with txnID as
// the transactional id (see transactionalID).
func kafkaConfig(c config.Kafka, txnID string) kafkasink.Config {
	return kafkasink.Config{
		Brokers: c.Brokers, Topic: c.Topic, ClientID: c.ClientID,
		Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor,
		TLS: kafkasink.TLS{
			Enabled: c.TLS.Enabled, CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile, KeyFile: c.TLS.KeyFile,
			InsecureSkipVerify: c.TLS.InsecureSkipVerify,
		},
		SASL: kafkasink.SASL{Mechanism: c.SASL.Mechanism, Username: c.SASL.Username, Password: c.SASL.Password,
			TokenFile: c.SASL.TokenFile},
		Transactional: c.Transactional, TransactionalID: txnID,
	}
}

// transactionalID is the Kafka transactional id of a relay with
// sink.kafka.transactional: the client id (default outbox-relay), then
// the replication slot in wal mode, where one relay of the slot publishes,
// or the outbox table in poll mode. It stays the same across restarts, so
// a restarted relay fences the process it replaces.
func transactionalID(cfg *config.Config) string {
	id := cfg.Sink.Kafka.ClientID
	if id == "" {
		id = "outbox-relay"
	}
	if cfg.Capture.Mode == "wal" {
		return id + "." + cfg.Capture.WAL.Slot
	}
	return id + "." + cfg.Outbox.Table
}

// sqsConfig maps sink.sqs to the SQS sink's settings.
func sqsConfig(c config.SQS) sqssink.Config {
	return sqssink.Config{Region: c.Region, Endpoint: c.Endpoint, QueueURL: c.QueueURL, Queue: c.Queue, MaxBatchBytes: c.MaxBatchBytes,
		RoleARN: c.RoleARN, ExternalID: c.ExternalID, RoleSessionName: c.RoleSessionName}
}

// rabbitmqConfig maps sink.rabbitmq to the RabbitMQ sink's settings.
func rabbitmqConfig(c config.RabbitMQ) rabbitmqsink.Config {
	return rabbitmqsink.Config{URL: c.URL, Exchange: c.Exchange, RoutingKey: c.RoutingKey, TLS: tlsconf.Files(c.TLS),
		MaxMessageBytes: c.MaxMessageBytes, Declare: c.Declare, ExchangeType: c.ExchangeType, Queue: c.Queue}
}

// redisConfig maps sink.redis to the Redis sink's settings.
func redisConfig(c config.Redis) redissink.Config {
	return redissink.Config{
		URL: c.URL, Stream: c.Stream, Username: c.Username, Password: c.Password, TLS: tlsconf.Files(c.TLS),
		ClusterAddrs: c.ClusterAddrs, MaxLen: int64(c.MaxLen),
		Sentinel: redissink.Sentinel{Master: c.Sentinel.Master, Addrs: c.Sentinel.Addrs,
			Username: c.Sentinel.Username, Password: c.Sentinel.Password},
	}
}

// webhookConfig maps sink.webhook to the webhook sink's settings.
func webhookConfig(c config.Webhook) webhook.Config {
	return webhook.Config{
		URL: c.URL, Timeout: c.Timeout.D(), Secret: c.Secret, Secrets: c.Secrets, Headers: c.Headers,
		MaxConcurrency: c.MaxConcurrency, HealthURL: c.HealthURL,
	}
}

// kafkaTopics creates the fixed topic when missing; templated topics are
// created by the sink on their first publish.
func kafkaTopics(ctx context.Context, s *kafkasink.Sink, tmpl string) (string, error) {
	created, err := s.EnsureTopics(ctx)
	switch t := s.FixedTopic(); {
	case err != nil:
		return "", err
	case t == "":
		return "kafka: topics of " + tmpl + " are created on their first publish", nil
	case len(created) > 0:
		return "kafka: topic " + t + " created", nil
	default:
		return "kafka: topic " + t + " exists", nil
	}
}

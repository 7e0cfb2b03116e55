package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	whsig "github.com/outboxrelay/relay/helpers/webhook"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/sink/envelope"
	rabbitmqsink "github.com/outboxrelay/relay/sink/rabbitmq"
	"github.com/outboxrelay/relay/sink/template"
	"github.com/outboxrelay/relay/sink/webhook"
)

// columnNames are the contract's outbox columns, the keys of outbox.columns.
var columnNames = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at", "seq"}

const maxBatchSize = 100000

// The bounds of capture.max_batch_bytes.
const (
	minBatchBytes = 64 << 10
	maxBatchBytes = 1 << 30
)

const maxPartitions = 1024

// maxIdentifier is PostgreSQL's limit on a name, in bytes.
const maxIdentifier = 63

// minConns is the least postgres.max_conns: one dedicated connection and
// one in the pool. wal capture needs more; see internal/app.
const minConns = 2

// maxLinger bounds capture.wal.linger, capture.poll.linger and
// sink.kafka.linger: each transaction of a steady stream may wait that
// long.
const maxLinger = 100 * time.Millisecond

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// setDefaults replaces zero values with the defaults documented on the
// fields of Config.
func setDefaults(c *Config) {
	orDefault(&c.Postgres.FatalAfter, Duration(5*time.Minute))
	orDefault(&c.Postgres.MaxConns, 8)
	orDefault(&c.Outbox.Table, "public.outbox")
	orDefault(&c.Capture.Poll.Interval, Duration(200*time.Millisecond))
	orDefault(&c.Capture.Poll.BatchSize, 500)
	orDefault(&c.Capture.Poll.Partitions, 16)
	orDefault(&c.Capture.MaxBatchBytes, 8<<20)
	orDefault(&c.Capture.WAL.Slot, "outbox_relay")
	orDefault(&c.Capture.WAL.Publication, "outbox_relay")
	orDefault(&c.Capture.WAL.Source, "table")
	orDefault(&c.Capture.WAL.MessagePrefix, "outbox")
	orDefault(&c.Sink.NATS.URL, "nats://127.0.0.1:4222")
	orDefault(&c.Sink.NATS.Subject, defaultDestination(c.Sink))
	orDefault(&c.Sink.NATS.Stream, "OUTBOX")
	orDefault(&c.Sink.Kafka.Topic, defaultDestination(c.Sink))
	orDefault(&c.Sink.RabbitMQ.Exchange, "outbox")
	if c.Sink.Format == "debezium" {
		orDefault(&c.Sink.RabbitMQ.RoutingKey, DebeziumDestination)
	}
	orDefault(&c.Sink.RabbitMQ.RoutingKey, "{aggregate_type}.{event_type}")
	orDefault(&c.Sink.Redis.URL, "redis://127.0.0.1:6379/0")
	orDefault(&c.Sink.Redis.Stream, defaultDestination(c.Sink))
	orDefault(&c.Sink.Webhook.Timeout, Duration(5*time.Second))
	orDefault(&c.Archive.Mode, "delete")
	orDefault(&c.Archive.Table, "public.outbox_archive")
	if c.Archive.Mode == "partition" {
		orDefault(&c.Archive.Partitions, 8)
		orDefault(&c.Archive.PartitionRows, 100000)
	}
	orDefault(&c.Retry.Initial, Duration(100*time.Millisecond))
	orDefault(&c.Retry.Max, Duration(30*time.Second))
	orDefault(&c.Retry.MaxAttempts, 10)
	orDefault(&c.DeadLetter.Table, "public.outbox_dead_letter")
	orDefault(&c.Log.Format, "text")
	orDefault(&c.Log.Level, "info")
	orDefault(&c.ShutdownTimeout, Duration(15*time.Second))
}

// orDefault sets *v to def when *v is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// validate checks c after the defaults were applied. Negative durations were
// already rejected while decoding, and zero ones replaced by defaults.
func (l *loader) validate(c *Config) {
	l.required("postgres.url", c.Postgres.URL, "")
	l.checkPassword(c.Postgres)
	l.checkIAMAuth(c.Postgres)
	if c.Postgres.FatalAfter.D() < time.Second {
		l.invalid("postgres.fatal_after", "must be at least 1s, got %s", c.Postgres.FatalAfter.D())
	}
	if c.Postgres.MaxConns < minConns {
		l.invalid("postgres.max_conns", "must be at least %d, got %d", minConns, c.Postgres.MaxConns)
	}
	l.table("outbox.table", c.Outbox.Table)
	l.checkColumns(c.Outbox.Columns)
	l.checkOrderBy(c.Outbox)
	l.checkCapture(c.Capture)
	l.checkSink(c.Sink)
	l.checkFormat(c)
	l.choice("archive.mode", c.Archive.Mode, "delete", "mark", "move", "partition")
	l.table("archive.table", c.Archive.Table)
	l.checkPartitionArchive(c)
	l.checkRetry(c.Retry)
	l.table("dead_letter.table", c.DeadLetter.Table)
	l.checkTablesDistinct(c)
	if c.Capture.WAL.Messages() && c.Sink.Type == "kafka" && c.Sink.Kafka.Transactional {
		l.invalid("capture.wal.source", "messages does not offer sink.kafka.transactional, which looks published events up in the outbox table: use capture.wal.source: table or remove the key")
	}
	if c.DeadLetter.ParkAggregate && c.Capture.Mode == "wal" {
		l.invalid("dead_letter.park_aggregate", "is not offered in wal mode (see docs/configuration.md): use capture.mode: poll or remove the key")
	}
	l.hostPort("http.listen", c.HTTP.Listen)
	l.advertise(c.HTTP)
	l.choice("log.format", c.Log.Format, "text", "json")
	l.choice("log.level", c.Log.Level, "debug", "info", "warn", "error")
	l.otlpEndpoint("tracing.otlp_endpoint", c.Tracing.OTLPEndpoint)
}

// The bounds of archive.partitions and archive.partition_rows.
const (
	minRingPartitions = 3
	maxRingPartitions = 64
	minPartitionRows  = 1000
)

// checkPartitionArchive checks archive mode partition: wal capture of an
// outbox table, and the ring's size; its keys with another mode are a
// mistake.
func (l *loader) checkPartitionArchive(c *Config) {
	a := c.Archive
	if a.Mode != "partition" {
		for _, key := range []string{"archive.partitions", "archive.partition_rows"} {
			if _, set := l.lines[key]; set {
				l.invalid(key, "is only used by archive.mode partition, got archive.mode %s: remove the key", a.Mode)
			}
		}
		return
	}
	switch {
	case c.Capture.Mode == "poll":
		l.invalid("archive.mode", "partition needs capture.mode: wal (poll capture marks a row published by removing it): use archive.mode delete")
	case c.Capture.WAL.Messages():
		l.invalid("archive.mode", "partition needs an outbox table; capture.wal.source messages has none: remove archive.mode")
	case c.Sink.Type == "kafka" && c.Sink.Kafka.Transactional:
		l.invalid("archive.mode", "partition keeps published rows in the outbox, where sink.kafka.transactional looks events up to tell published from unpublished: use archive.mode delete or remove sink.kafka.transactional")
	}
	if a.Partitions < minRingPartitions || a.Partitions > maxRingPartitions {
		l.invalid("archive.partitions", "must be between %d and %d, got %d", minRingPartitions, maxRingPartitions, a.Partitions)
	}
	if a.PartitionRows < minPartitionRows {
		l.invalid("archive.partition_rows", "must be at least %d, got %d", minPartitionRows, a.PartitionRows)
	}
}

// otlpEndpoint checks an optional OTLP endpoint: host:port with a host and
// a port from 1 to 65535, or an absolute http or https URL with a host.
func (l *loader) otlpEndpoint(key, value string) {
	if value == "" {
		return
	}
	if u, err := url.Parse(value); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			l.invalid(key, "an OTLP/HTTP URL needs a host and no credentials, query or fragment, e.g. http://127.0.0.1:4318")
		}
		return
	}
	host, port, err := net.SplitHostPort(value)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		l.invalid(key, "must be host:port for OTLP/gRPC (e.g. 127.0.0.1:4317) or an http:// or https:// URL for OTLP/HTTP, got %q", redact.String(value))
	}
}

// checkColumns checks the outbox.columns remapping.
func (l *loader) checkColumns(cols map[string]string) {
	for _, name := range slices.Sorted(maps.Keys(cols)) {
		key := "outbox.columns." + name
		if !slices.Contains(columnNames, name) {
			l.invalid(key, "unknown column (expected one of %s)", strings.Join(columnNames, ", "))
		} else if l.required(key, cols[name], "the table's column name") && len(cols[name]) > maxIdentifier {
			l.invalid(key, "longer than PostgreSQL's %d bytes", maxIdentifier)
		}
	}
}

// checkOrderBy checks outbox.order_by: a column name that is not one of
// the other contract columns.
func (l *loader) checkOrderBy(o Outbox) {
	col := o.OrderColumn()
	if len(col) > maxIdentifier {
		l.invalid("outbox.order_by", "longer than PostgreSQL's %d bytes", maxIdentifier)
	}
	for _, name := range columnNames {
		if name != "aggregate_id" && o.Column(name) == col {
			l.invalid("outbox.order_by", "names the %s column %q; use aggregate_id (the default) or another column of the table, e.g. tenant_id", name, col)
		}
	}
}

// checkCapture checks the mode and the settings of both modes.
func (l *loader) checkCapture(c Capture) {
	l.choice("capture.mode", c.Mode, "wal", "poll")
	if c.Poll.BatchSize < 1 || c.Poll.BatchSize > maxBatchSize {
		l.invalid("capture.poll.batch_size", "must be between 1 and %d, got %d", maxBatchSize, c.Poll.BatchSize)
	}
	if c.MaxBatchBytes < minBatchBytes || c.MaxBatchBytes > maxBatchBytes {
		l.invalid("capture.max_batch_bytes", "must be between %d (64 KiB) and %d (1 GiB), got %d", minBatchBytes, maxBatchBytes, c.MaxBatchBytes)
	}
	if c.Poll.Partitions < 1 || c.Poll.Partitions > maxPartitions {
		l.invalid("capture.poll.partitions", "must be between 1 and %d, got %d", maxPartitions, c.Poll.Partitions)
	}
	if !slotName.MatchString(c.WAL.Slot) {
		l.invalid("capture.wal.slot", "must match %s (lowercase letters, digits and _), got %q", slotName, c.WAL.Slot)
	}
	if c.Poll.Linger.D() > maxLinger {
		l.invalid("capture.poll.linger", "must be at most %s, got %s", maxLinger, c.Poll.Linger.D())
	}
	if c.WAL.Linger.D() > maxLinger {
		l.invalid("capture.wal.linger", "must be at most %s, got %s", maxLinger, c.WAL.Linger.D())
	}
	if len(c.WAL.Publication) > 63 {
		l.invalid("capture.wal.publication", "must be at most 63 bytes (PostgreSQL truncates longer names), got %d", len(c.WAL.Publication))
	}
	if l.choice("capture.wal.source", c.WAL.Source, "table", "messages") && c.WAL.Messages() && c.Mode != "wal" {
		l.invalid("capture.wal.source", "messages needs capture.mode: wal, got %s", c.Mode)
	}
}

// checkSink checks the selected sink's settings; the others are ignored.
func (l *loader) checkSink(s Sink) {
	l.checkRateLimit(s.RateLimit)
	if !l.choice("sink.type", s.Type, "kafka", "nats", "pubsub", "rabbitmq", "redis", "sqs", "webhook") {
		return
	}
	switch s.Type {
	case "kafka":
		l.checkKafka(s.Kafka)
	case "nats":
		l.checkNATS(s.NATS)
	case "rabbitmq":
		l.checkRabbitMQ(s.RabbitMQ)
	case "sqs":
		l.checkSQS(s.SQS)
	case "pubsub":
		l.checkPubSub(s)
	case "redis":
		l.checkRedis(s.Redis)
	case "webhook":
		l.checkWebhook(s.Webhook)
	}
	l.checkEnvelope(s)
}

// checkEnvelope checks sink.envelope (empty means none) and, with
// cloudevents, the source prefix; sink.cloudevents without that envelope is
// a mistake.
func (l *loader) checkEnvelope(s Sink) {
	if _, set := l.lines["sink.envelope"]; set && !l.choice("sink.envelope", s.Envelope, "none", "cloudevents") {
		return
	}
	if s.Envelope != "cloudevents" {
		if _, set := l.lines["sink.cloudevents"]; set {
			l.invalid("sink.cloudevents", "has no effect unless sink.envelope is cloudevents")
		}
		return
	}
	if l.required("sink.cloudevents.source", s.CloudEvents.Source, "a URI reference such as urn:example:orders; each event's source is it joined with the aggregate_type") {
		if err := envelope.CheckSource(s.CloudEvents.Source); err != nil {
			l.invalid("sink.cloudevents.source", "%s", err)
		}
	}
	if s.Type == "webhook" {
		for _, name := range slices.Sorted(maps.Keys(s.Webhook.Headers)) {
			if envelope.HTTP.Owns(name) {
				l.invalid("sink.webhook.headers."+name, "the cloudevents envelope sets the Ce- headers; remove this one")
			}
		}
	}
}

// maxWebhookConcurrency bounds sink.webhook.max_concurrency.
const maxWebhookConcurrency = 10000

// checkWebhook checks the webhook sink: an absolute http or https URL with
// placeholders only in its path and query, a secret of at least 16 bytes
// when the key is present (an unset ${VAR} must not silently turn signing
// off), valid
// static headers and the concurrency bound. Messages never repeat the URL,
// the secret or a header value, which may hold credentials.
func (l *loader) checkWebhook(w Webhook) {
	if l.required("sink.webhook.url", w.URL, "") {
		if _, err := template.Parse(w.URL, nil); err != nil {
			l.invalid("sink.webhook.url", "%s", redact.String(err.Error()))
		} else if err := destname.WebhookURL(w.URL); err != nil {
			l.invalid("sink.webhook.url", "%s", err)
		}
	}
	l.checkSecrets(w)
	for _, name := range slices.Sorted(maps.Keys(w.Headers)) {
		if err := webhook.CheckStaticHeader(name, w.Headers[name]); err != nil {
			l.invalid("sink.webhook.headers."+name, "%s", err)
		}
	}
	if _, set := l.lines["sink.webhook.health_url"]; set && l.required("sink.webhook.health_url", w.HealthURL, "remove the key to leave an idle receiver unchecked") {
		if strings.Contains(w.HealthURL, "{") {
			l.invalid("sink.webhook.health_url", "placeholders are not allowed: the health URL is one fixed URL")
		} else if err := destname.WebhookURL(w.HealthURL); err != nil {
			l.invalid("sink.webhook.health_url", "%s", err)
		}
	}
	if w.MaxConcurrency < 0 || w.MaxConcurrency > maxWebhookConcurrency {
		l.invalid("sink.webhook.max_concurrency", "must be between 1 and %d (0 or unset: 64), got %d", maxWebhookConcurrency, w.MaxConcurrency)
	}
}

// checkSecrets checks sink.webhook.secret or, instead, sink.webhook.secrets:
// each present key set (an unset ${VAR} must not silently turn signing
// off) and each secret one ParseSecret accepts.
func (l *loader) checkSecrets(w Webhook) {
	_, one := l.lines["sink.webhook.secret"]
	_, list := l.lines["sink.webhook.secrets"]
	if one && list {
		l.invalid("sink.webhook.secrets", "set either sink.webhook.secret or sink.webhook.secrets, not both")
		return
	}
	if list && len(w.Secrets) == 0 {
		l.required("sink.webhook.secrets", "", "a list of secrets; remove the key to send unsigned requests")
	}
	check := func(key, secret string) {
		if !l.required(key, secret, "remove the key to send unsigned requests") {
			return
		}
		if _, err := whsig.ParseSecret(secret); err != nil {
			l.invalid(key, "%s (whsec_<base64> or a raw string of at least %d bytes)", err, whsig.MinSecretBytes)
		}
	}
	if one {
		check("sink.webhook.secret", w.Secret)
	}
	for i, s := range w.Secrets {
		check(fmt.Sprintf("sink.webhook.secrets[%d]", i), s)
	}
}

// Kafka limits: partition counts are int32 and replication factors int16
// on the wire.
const (
	maxKafkaPartitions  = 1<<31 - 1
	maxKafkaReplication = 1<<15 - 1
)

// checkKafka checks the kafka sink: brokers are required, the topic
// template's literal text must be legal in a topic name, creation settings
// must fit the protocol, TLS keys need tls.enabled, and a SASL mechanism
// needs a username and password. Messages never repeat the password.
func (l *loader) checkKafka(k Kafka) {
	if len(k.Brokers) == 0 {
		l.required("sink.kafka.brokers", "", "a list of host:port")
	}
	for i, b := range k.Brokers {
		l.required(fmt.Sprintf("sink.kafka.brokers[%d]", i), b, "")
	}
	if _, err := template.Parse(k.Topic, nil); err != nil {
		l.invalid("sink.kafka.topic", "%s", err)
	} else if err := destname.KafkaTopicTemplate(k.Topic); err != nil {
		l.invalid("sink.kafka.topic", "%s", err)
	}
	if k.Partitions < 0 || k.Partitions > maxKafkaPartitions {
		l.invalid("sink.kafka.partitions", "must be between 1 and %d (0 or unset: the broker's num.partitions), got %d", maxKafkaPartitions, k.Partitions)
	}
	if k.ReplicationFactor < 0 || k.ReplicationFactor > maxKafkaReplication {
		l.invalid("sink.kafka.replication_factor", "must be between 1 and %d (0 or unset: the broker's default.replication.factor), got %d", maxKafkaReplication, k.ReplicationFactor)
	}
	if k.Linger.D() > maxLinger {
		l.invalid("sink.kafka.linger", "must be at most %s, got %s", maxLinger, k.Linger.D())
	}
	l.checkTLS("sink.kafka.tls", k.TLS)
	l.checkKafkaSASL(k.SASL)
}

// kafkaMechanisms are the values of sink.kafka.sasl.mechanism.
var kafkaMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "AWS_MSK_IAM", "OAUTHBEARER"}

// checkKafkaSASL checks sink.kafka.sasl: the credentials each mechanism
// takes, and none without a mechanism.
func (l *loader) checkKafkaSASL(s KafkaSASL) {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.TokenFile != "" {
			l.required("sink.kafka.sasl.mechanism", "", orList(kafkaMechanisms))
		}
		return
	}
	if !l.choice("sink.kafka.sasl.mechanism", s.Mechanism, kafkaMechanisms...) {
		return
	}
	switch s.Mechanism {
	case "AWS_MSK_IAM":
		if s.Username != "" || s.Password != "" || s.TokenFile != "" {
			l.invalid("sink.kafka.sasl.mechanism", "AWS_MSK_IAM signs in with the AWS SDK's default credential chain: remove sink.kafka.sasl.username, password and token_file")
		}
	case "OAUTHBEARER":
		if s.TokenFile == "" && s.Password == "" {
			l.required("sink.kafka.sasl.token_file", "", "a file with the bearer token (or the token itself in sink.kafka.sasl.password)")
		}
	default:
		if s.TokenFile != "" {
			l.invalid("sink.kafka.sasl.token_file", "is for OAUTHBEARER only")
		}
		l.required("sink.kafka.sasl.username", s.Username, "")
		l.required("sink.kafka.sasl.password", s.Password, "use ${VAR} to read it from the environment")
	}
}

// checkTLS checks the TLS block at key: its other keys need enabled, and a
// client certificate needs its key and the other way round.
func (l *loader) checkTLS(key string, t TLS) {
	if !t.Enabled {
		for _, k := range []struct {
			name string
			set  bool
		}{
			{"ca_file", t.CAFile != ""}, {"cert_file", t.CertFile != ""},
			{"key_file", t.KeyFile != ""}, {"insecure_skip_verify", t.InsecureSkipVerify},
		} {
			if k.set {
				l.invalid(key+"."+k.name, "has no effect unless %s.enabled is true", key)
			}
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		l.required(key+".key_file", "", "the client key of "+key+".cert_file")
	case t.KeyFile != "" && t.CertFile == "":
		l.required(key+".cert_file", "", "the client certificate of "+key+".key_file")
	}
}

// maxNATSReplicas is JetStream's largest replica count.
const maxNATSReplicas = 5

// checkNATS checks the nats sink: the subject template, at most one way to
// authenticate, a password with its user, TLS, and the settings of the
// stream the relay creates. Messages never repeat a password or token.
func (l *loader) checkNATS(n NATS) {
	l.template("sink.nats.subject", n.Subject)
	var auth []string
	for _, a := range []struct{ key, value string }{
		{"sink.nats.credentials_file", n.CredentialsFile}, {"sink.nats.nkey_file", n.NKeyFile},
		{"sink.nats.username", n.Username}, {"sink.nats.token", n.Token},
	} {
		if a.value != "" {
			auth = append(auth, a.key)
		} else if _, set := l.lines[a.key]; set {
			// An unset ${VAR} must not silently connect without credentials.
			l.required(a.key, "", "remove the key to connect without it")
		}
	}
	if len(auth) > 1 {
		l.invalid(auth[1], "set only one way to authenticate, got %s", orList(auth))
	}
	if n.Password != "" && n.Username == "" {
		l.required("sink.nats.username", "", "the user of sink.nats.password")
	} else if n.Username != "" {
		l.required("sink.nats.password", n.Password, "use ${VAR} to read it from the environment")
	}
	l.checkTLS("sink.nats.tls", n.TLS)
	if n.Replicas < 0 || n.Replicas > maxNATSReplicas {
		l.invalid("sink.nats.replicas", "must be between 1 and %d (0 or unset: 1), got %d", maxNATSReplicas, n.Replicas)
	}
	if n.Storage != "" {
		l.choice("sink.nats.storage", n.Storage, "file", "memory")
	}
	if n.MaxBytes < 0 {
		l.invalid("sink.nats.max_bytes", "must be at least 0 (0: unlimited), got %d", n.MaxBytes)
	}
	if n.MaxMsgs < 0 {
		l.invalid("sink.nats.max_msgs", "must be at least 0 (0: unlimited), got %d", n.MaxMsgs)
	}
	if n.MaxAge > 0 && n.DuplicateWindow > n.MaxAge {
		l.invalid("sink.nats.duplicate_window", "must be at most sink.nats.max_age (%s), got %s", n.MaxAge.D(), n.DuplicateWindow.D())
	} else if n.MaxAge > 0 && n.DuplicateWindow == 0 && n.MaxAge.D() < 2*time.Minute {
		l.invalid("sink.nats.max_age", "is shorter than the default duplicate window (2m): set sink.nats.duplicate_window to at most %s", n.MaxAge.D())
	}
}

// checkRedis checks the redis sink: a redis, rediss or unix URL (its
// database 0 with a cluster), the stream template, credentials set when
// their keys are present, TLS, and either cluster seed nodes or a Sentinel
// master with its addresses. Messages never repeat a password.
func (l *loader) checkRedis(r Redis) {
	u, err := url.Parse(r.URL)
	switch {
	case err != nil || u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "unix":
		l.invalid("sink.redis.url", "must be a redis://, rediss:// or unix:// URL such as redis://127.0.0.1:6379/0, got %q", redact.String(r.URL))
	case u.Scheme != "unix" && u.Host == "":
		l.invalid("sink.redis.url", "has no host, got %q", redact.String(r.URL))
	case len(r.ClusterAddrs) > 0 && strings.Trim(u.Path, "/") != "" && strings.Trim(u.Path, "/") != "0":
		l.invalid("sink.redis.url", "a Redis Cluster has database 0 only, got %q", strings.Trim(u.Path, "/"))
	}
	l.template("sink.redis.stream", r.Stream)
	for _, c := range []struct{ key, value string }{
		{"sink.redis.username", r.Username}, {"sink.redis.password", r.Password},
		{"sink.redis.sentinel.username", r.Sentinel.Username}, {"sink.redis.sentinel.password", r.Sentinel.Password},
	} {
		if _, set := l.lines[c.key]; set {
			// An unset ${VAR} must not silently connect without credentials.
			l.required(c.key, c.value, "remove the key to connect without it")
		}
	}
	l.checkTLS("sink.redis.tls", r.TLS)
	for i, a := range r.ClusterAddrs {
		l.hostPort(fmt.Sprintf("sink.redis.cluster_addrs[%d]", i), a)
	}
	for i, a := range r.Sentinel.Addrs {
		l.hostPort(fmt.Sprintf("sink.redis.sentinel.addrs[%d]", i), a)
	}
	switch s := r.Sentinel; {
	case s.Master != "" && len(r.ClusterAddrs) > 0:
		l.invalid("sink.redis.sentinel", "set either sink.redis.cluster_addrs or sink.redis.sentinel, not both")
	case s.Master != "" && len(s.Addrs) == 0:
		l.required("sink.redis.sentinel.addrs", "", "the Sentinels' host:port addresses")
	case s.Master == "" && (len(s.Addrs) > 0 || s.Username != "" || s.Password != ""):
		l.required("sink.redis.sentinel.master", "", "the master's name in the Sentinel configuration")
	}
	if r.MaxLen < 0 {
		l.invalid("sink.redis.max_len", "must be at least 0 (0: no trimming), got %d", r.MaxLen)
	}
}

// checkRateLimit checks sink.rate_limit: no negative values, and a burst
// only with a rate.
func (l *loader) checkRateLimit(r RateLimit) {
	if r.EventsPerSecond < 0 {
		l.invalid("sink.rate_limit.events_per_second", "must be at least 0 (0: unlimited), got %d", r.EventsPerSecond)
	}
	switch {
	case r.Burst < 0:
		l.invalid("sink.rate_limit.burst", "must be at least 0 (0: a tenth of events_per_second), got %d", r.Burst)
	case r.Burst > 0 && r.EventsPerSecond == 0:
		l.invalid("sink.rate_limit.burst", "has no effect without sink.rate_limit.events_per_second")
	}
}

// checkPubSub checks the pubsub sink: a project, a topic template that
// renders valid topic IDs, and no CloudEvents envelope (not supported yet).
func (l *loader) checkPubSub(s Sink) {
	p := s.PubSub
	l.required("sink.pubsub.project_id", p.ProjectID, "the Google Cloud project of the topics")
	if l.required("sink.pubsub.topic", p.Topic, "a topic ID template such as outbox.{aggregate_type}") {
		if _, err := template.Parse(p.Topic, nil); err != nil {
			l.invalid("sink.pubsub.topic", "%s", err)
		} else if err := destname.PubSubTopicTemplate(p.Topic); err != nil {
			l.invalid("sink.pubsub.topic", "%s", err)
		}
	}
	if _, set := l.lines["sink.pubsub.credentials_file"]; set && p.CredentialsFile == "" {
		l.required("sink.pubsub.credentials_file", "", "remove the key to use Application Default Credentials")
	}
	if p.PublishTimeout.D() < 0 {
		l.invalid("sink.pubsub.publish_timeout", "must be positive, got %s", p.PublishTimeout.D())
	}
	if d := p.BatchDelay.D(); d < 0 || d > 100*time.Millisecond {
		l.invalid("sink.pubsub.batch_delay", "must be between 0 and 100ms, got %s", d)
	}
	if p.MaxPublishers < 0 {
		l.invalid("sink.pubsub.max_publishers", "must be positive, got %d", p.MaxPublishers)
	}
	if s.Envelope == "cloudevents" {
		l.invalid("sink.envelope", "cloudevents is not supported with sink.type pubsub")
	}
}

// checkRabbitMQ checks the rabbitmq sink: an amqp(s) URL, templates that
// render valid names, TLS, and what declare needs.
func (l *loader) checkRabbitMQ(r RabbitMQ) {
	if l.required("sink.rabbitmq.url", r.URL, "such as amqp://relay:${RABBITMQ_PASSWORD}@127.0.0.1:5672/") {
		if _, err := amqp.ParseURI(r.URL); err != nil {
			l.invalid("sink.rabbitmq.url", "%s", redact.String(err.Error()))
		}
	}
	if _, err := rabbitmqsink.New(rabbitmqsink.Config{URL: "amqp://127.0.0.1/", Exchange: r.Exchange, RoutingKey: r.RoutingKey}, rabbitmqsink.Options{}); err != nil {
		key := "sink.rabbitmq.routing_key"
		if strings.HasPrefix(err.Error(), "sink.rabbitmq.exchange") {
			key = "sink.rabbitmq.exchange"
		}
		_, msg, _ := strings.Cut(err.Error(), ": ")
		l.invalid(key, "%s", msg)
	}
	l.checkTLS("sink.rabbitmq.tls", r.TLS)
	if r.MaxMessageBytes < 0 {
		l.invalid("sink.rabbitmq.max_message_bytes", "must be at least 0 (0: 16777216), got %d", r.MaxMessageBytes)
	}
	if r.ExchangeType != "" {
		l.choice("sink.rabbitmq.exchange_type", r.ExchangeType, "topic", "direct", "fanout", "headers")
	}
	if r.Declare && (r.Exchange == "" || strings.Contains(r.Exchange, "{")) {
		l.invalid("sink.rabbitmq.declare", "needs sink.rabbitmq.exchange to name one exchange, without placeholders")
	}
}

// checkSQS checks the sqs sink: a region and exactly one queue setting.
func (l *loader) checkSQS(s SQS) {
	l.required("sink.sqs.region", s.Region, "")
	switch {
	case s.QueueURL != "" && s.Queue != "":
		l.invalid("sink.sqs.queue", "set either sink.sqs.queue_url or sink.sqs.queue, not both")
	case s.Queue != "":
		l.template("sink.sqs.queue", s.Queue)
	default:
		l.required("sink.sqs.queue_url", s.QueueURL, "or sink.sqs.queue, a queue name template")
	}
	if s.MaxBatchBytes != 0 && (s.MaxBatchBytes < 1024 || s.MaxBatchBytes > 1<<20) {
		l.invalid("sink.sqs.max_batch_bytes", "must be between 1024 and 1048576, got %d", s.MaxBatchBytes)
	}
	l.checkRole(s)
}

// roleARN matches an IAM role ARN in any partition; sessionName a valid
// STS role session name.
var (
	roleARN     = regexp.MustCompile(`^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$`)
	sessionName = regexp.MustCompile(`^[\w+=,.@-]{2,64}$`)
)

// checkRole checks sink.sqs.role_arn and the keys that go with it.
func (l *loader) checkRole(s SQS) {
	if s.RoleARN == "" {
		if s.ExternalID != "" {
			l.invalid("sink.sqs.external_id", "has no effect without sink.sqs.role_arn")
		}
		if s.RoleSessionName != "" {
			l.invalid("sink.sqs.role_session_name", "has no effect without sink.sqs.role_arn")
		}
		return
	}
	if !roleARN.MatchString(s.RoleARN) {
		l.invalid("sink.sqs.role_arn", "must be an IAM role ARN like arn:aws:iam::123456789012:role/outbox-relay, got %q", s.RoleARN)
	}
	if n := len(s.ExternalID); n > 0 && (n < 2 || n > 1224 || !externalID.MatchString(s.ExternalID)) {
		l.invalid("sink.sqs.external_id", "must be 2 to 1224 characters of letters, digits and +=,.@:/-")
	}
	if s.RoleSessionName != "" && !sessionName.MatchString(s.RoleSessionName) {
		l.invalid("sink.sqs.role_session_name", "must be 2 to 64 characters of letters, digits and +=,.@_-, got %q", s.RoleSessionName)
	}
}

// externalID matches a valid STS external id.
var externalID = regexp.MustCompile(`^[\w+=,.@:/-]+$`)

// checkRetry checks the backoff bounds and the attempt limit.
func (l *loader) checkRetry(r Retry) {
	if r.Max < r.Initial {
		l.invalid("retry.max", "must be at least retry.initial (%s), got %s", r.Initial.D(), r.Max.D())
	}
	if r.MaxAttempts < 1 {
		l.invalid("retry.max_attempts", "must be at least 1, got %d", r.MaxAttempts)
	}
}

// invalid records a problem with the value of key, on key's line if the key
// is in the file, else on the line of its nearest enclosing section that is.
func (l *loader) invalid(key, format string, args ...any) {
	l.errorf(l.lineFor(key), key, format, args...)
}

// lineFor returns the line of key, or of its nearest enclosing section in
// the file, or 0.
func (l *loader) lineFor(key string) int {
	for k := key; k != ""; {
		if line, ok := l.lines[k]; ok {
			return line
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return 0
}

// hostPort checks an optional listen address: host:port, the host possibly
// empty (all interfaces), the port a number from 0 to 65535.
func (l *loader) hostPort(key, value string) {
	if value == "" {
		return
	}
	_, port, err := net.SplitHostPort(value)
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 0 || n > 65535 {
			err = errors.New("the port must be a number from 0 to 65535")
		}
	}
	if err != nil {
		l.invalid(key, "must be host:port, e.g. 127.0.0.1:9090 or :9090, got %q", value)
	}
}

// maxAdvertise bounds http.advertise: PostgreSQL keeps 63 bytes of an
// application_name, which also holds "outbox-relay ".
const maxAdvertise = 50

// advertise checks http.advertise: a host and a port from 1 to 65535, at
// most maxAdvertise bytes, and only with http.listen.
func (l *loader) advertise(h HTTP) {
	if h.Advertise == "" {
		return
	}
	host, port, err := net.SplitHostPort(h.Advertise)
	n, perr := strconv.Atoi(port)
	switch {
	case h.Listen == "":
		l.invalid("http.advertise", "needs http.listen: without it there is nothing to reach")
	case err != nil || host == "" || perr != nil || n < 1 || n > 65535 || len(h.Advertise) > maxAdvertise:
		l.invalid("http.advertise", "must be host:port with a host, a port from 1 to 65535 and at most %d bytes, e.g. relay-0.relay:9090, got %q",
			maxAdvertise, h.Advertise)
	}
}

// required reports whether value is set, recording an error if not; what,
// if not empty, describes the expected value.
func (l *loader) required(key, value, what string) bool {
	if value != "" {
		return true
	}
	msg := "required"
	if _, present := l.lines[key]; present {
		msg = "must not be empty"
	}
	if what != "" {
		msg += " (" + what + ")"
	}
	l.invalid(key, "%s", msg)
	return false
}

// choice reports whether value is one of allowed, recording an error if not.
func (l *loader) choice(key, value string, allowed ...string) bool {
	if !l.required(key, value, orList(allowed)) {
		return false
	}
	if !slices.Contains(allowed, value) {
		l.invalid(key, "must be %s, got %q", orList(allowed), value)
		return false
	}
	return true
}

// table checks a table name: name or schema.name, each at most 63 bytes.
func (l *loader) table(key, value string) {
	parts := strings.Split(value, ".")
	switch {
	case len(parts) > 2 || slices.Contains(parts, ""):
		l.invalid(key, `must be "name" or "schema.name", got %q`, value)
	case slices.ContainsFunc(parts, func(p string) bool { return len(p) > maxIdentifier }):
		l.invalid(key, "a name is longer than PostgreSQL's %d bytes, got %q", maxIdentifier, value)
	}
}

// checkTablesDistinct refuses a dead-letter table that is the outbox table
// or, with archive.mode move, the archive table, and an archive table that
// is the outbox table: the relay would capture its own dead letters or
// archived rows. A name without a schema is taken as public's.
func (l *loader) checkTablesDistinct(c *Config) {
	same := func(a, b string) bool { return publicName(a) == publicName(b) }
	if same(c.DeadLetter.Table, c.Outbox.Table) {
		l.invalid("dead_letter.table", "must not be the outbox table (%s)", c.Outbox.Table)
	}
	if c.Archive.Mode != "move" {
		return
	}
	if same(c.Archive.Table, c.Outbox.Table) {
		l.invalid("archive.table", "must not be the outbox table (%s)", c.Outbox.Table)
	}
	if same(c.DeadLetter.Table, c.Archive.Table) {
		l.invalid("dead_letter.table", "must not be the archive table (%s)", c.Archive.Table)
	}
}

// publicName returns a table name with the schema public added when it has
// none.
func publicName(table string) string {
	if strings.Contains(table, ".") {
		return table
	}
	return "public." + table
}

// template checks that a destination template uses only known placeholders.
// The message goes through redact.String since URLs may carry secrets.
func (l *loader) template(key, value string) {
	if _, err := template.Parse(value, nil); err != nil {
		l.invalid(key, "%s", redact.String(err.Error()))
	}
}

// orList writes words as "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// checkIAMAuth checks postgres.aws_iam_auth: a region made of letters,
// digits and dashes, and no password in postgres.url beside it.
func (l *loader) checkIAMAuth(p Postgres) {
	region := p.AWSIAMAuth.Region
	if region == "" {
		return
	}
	if !awsRegion.MatchString(region) {
		l.invalid("postgres.aws_iam_auth.region", "must be an AWS region such as eu-west-1, got %q", region)
	}
	if urlPassword(p.URL) || p.Password != "" || p.PasswordFile != "" {
		l.invalid("postgres.aws_iam_auth.region", "IAM authentication signs a token for every connection: remove the password from postgres.url, postgres.password and postgres.password_file")
	}
}

// checkPassword checks that at most one of postgres.url, postgres.password
// and postgres.password_file gives the password.
func (l *loader) checkPassword(p Postgres) {
	switch {
	case p.Password != "" && p.PasswordFile != "":
		l.invalid("postgres.password_file", "set postgres.password or postgres.password_file, not both")
	case (p.Password != "" || p.PasswordFile != "") && urlPassword(p.URL):
		key := "postgres.password"
		if p.PasswordFile != "" {
			key = "postgres.password_file"
		}
		l.invalid(key, "postgres.url carries a password too: remove it from the URL")
	}
}

// urlPassword reports whether a libpq URL or key=value string names a
// password.
func urlPassword(s string) bool {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	return kvPassword.MatchString(s)
}

var kvPassword = regexp.MustCompile(`(^|\s)password\s*=`)

// awsRegion matches an AWS region name.
var awsRegion = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)

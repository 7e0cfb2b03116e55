// Package config loads the relay's YAML configuration file into typed,
// validated structs. See docs/configuration.md.
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
	Tracing    Tracing    `yaml:"tracing"`
	// ShutdownTimeout bounds how long SIGINT/SIGTERM waits for in-flight
	// publishes and archiving before exiting. Default 15s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
}

// Postgres says how to reach the database.
type Postgres struct {
	// URL is a libpq connection URL or key=value string. Required. A
	// password in it must be percent-encoded (URL) or quoted (key=value)
	// when it holds characters these forms reserve; Password and
	// PasswordFile need no encoding.
	URL string `yaml:"url"`
	// Password is the password of every connection the relay opens,
	// taken as is (no URL encoding); it is never printed. Optional; it
	// excludes a password in URL, PasswordFile and AWSIAMAuth.
	Password string `yaml:"password"`
	// PasswordFile is a file holding the password (one trailing newline is
	// dropped), read again for every new connection, so a rotated secret
	// mounted as a file applies without a restart. Optional; it excludes a
	// password in URL, Password and AWSIAMAuth.
	PasswordFile string `yaml:"password_file"`
	// FatalAfter bounds how long `relay run` keeps retrying a database
	// failure that will not pass by itself (a missing privilege, table or
	// column) before it exits with status 1. Meanwhile it reports not
	// ready and retries with backoff capped at retry.max. Default 5m; at
	// least 1s.
	FatalAfter Duration `yaml:"fatal_after"`
	// MaxConns is the most connections to Postgres the relay opens at
	// once, counting its pool and its dedicated connections (partition
	// leases in poll mode; replication and the leader lock in wal mode).
	// Default 8; at least 2.
	MaxConns int `yaml:"max_conns"`
	// AWSIAMAuth signs in to RDS or Aurora with IAM instead of a password.
	AWSIAMAuth AWSIAMAuth `yaml:"aws_iam_auth"`
}

// AWSIAMAuth configures RDS/Aurora IAM database authentication: every
// connection the relay opens gets a fresh token (valid 15 minutes) signed
// with the AWS SDK's default credential chain (environment, shared files,
// web identity, ECS and EC2 roles) for postgres.url's first host and port
// and user.
type AWSIAMAuth struct {
	// Region is the database's AWS region. Setting it turns IAM
	// authentication on; postgres.url must then carry no password.
	Region string `yaml:"region"`
}

// Outbox names the outbox table and its columns.
type Outbox struct {
	// Table is the outbox table, optionally schema-qualified. Default
	// public.outbox.
	Table string `yaml:"table"`
	// Columns remaps contract column names (id, aggregate_type, aggregate_id,
	// event_type, payload, headers, created_at, seq) to the table's names.
	Columns map[string]string `yaml:"columns"`
	// OrderBy names the outbox column that is the ordering and partition
	// key: events with one value are published in order, and the value is
	// the Kafka record key and the SQS message group. Any column type
	// works; it is read as text. Default aggregate_id, which follows
	// Columns' remapping; see OrderColumn.
	OrderBy string `yaml:"order_by"`
}

// Capture selects and tunes the capture mode.
type Capture struct {
	// Mode is "wal" or "poll". Required.
	Mode string `yaml:"mode"`
	Poll Poll   `yaml:"poll"`
	WAL  WAL    `yaml:"wal"`
	// MaxBatchBytes bounds, in bytes (payload, headers, the other values
	// and about 512 bytes a row), what one poll claim, wal batch and
	// publish call holds; a row larger than it goes alone. Captured rows
	// not yet archived hold at most three times as much, of which events
	// not yet published twice. Default 8 MiB (8388608).
	MaxBatchBytes int `yaml:"max_batch_bytes"`
}

// Poll tunes poll capture.
type Poll struct {
	// Interval is the longest wait between polls when the outbox is idle.
	// Default 200ms.
	Interval Duration `yaml:"interval"`
	// Linger is how long the poller waits after a poll that found rows,
	// fewer than 32, so that a steady stream of small transactions is
	// claimed in fewer, larger batches: each row waits at most Linger more,
	// and the relay claims, publishes and archives once per Linger rather
	// than once per few rows. At most 100ms. Default 5ms.
	Linger Duration `yaml:"linger"`
	// BatchSize is the most rows claimed by one poll. Default 500.
	BatchSize int `yaml:"batch_size"`
	// Partitions is how many partitions (by hash of the ordering key) relays
	// running against one outbox share between them; every relay on one
	// outbox must use the same value. Default 16.
	Partitions int `yaml:"partitions"`
	// Notify makes `relay init` install a statement-level insert trigger
	// that calls pg_notify, so the poller wakes at once on every insert.
	// Default false, and init then removes the trigger: PostgreSQL
	// serializes the commits of notifying transactions, which lowers the
	// application's commit rate (docs/benchmarks.md measures by how much).
	// Without it the poller finds a steady trickle within milliseconds
	// anyway and an idle outbox within capture.poll.interval.
	Notify bool `yaml:"notify"`
}

// WAL tunes logical replication capture.
type WAL struct {
	// Slot is the logical replication slot, created if missing. Default
	// outbox_relay.
	Slot string `yaml:"slot"`
	// Publication is the publication, created if missing. Default
	// outbox_relay.
	Publication string `yaml:"publication"`
	// Failover creates the slot with failover enabled, so that a standby
	// synchronizing slots keeps its position across a promotion
	// (PostgreSQL 17 and later). Default false.
	Failover bool `yaml:"failover"`
	// Linger is how long a stream of small transactions gathers into one
	// batch: after a read from the replication socket that brought little,
	// the next read waits until Linger after it, so each transaction waits
	// at most Linger and the relay wakes up, publishes and archives once
	// per Linger rather than once per transaction. The first transaction
	// after a pause and a backlog go without waiting. At most 100ms.
	// Default 2ms.
	Linger Duration `yaml:"linger"`
	// Source is where events come from: table, the outbox table's inserts,
	// or messages, transactional logical decoding messages the application
	// writes with pg_logical_emit_message (PostgreSQL 14 and later; no
	// outbox table, no archive). Default table.
	Source string `yaml:"source"`
	// MessagePrefix is the prefix of the logical decoding messages the
	// relay captures with source messages; messages with other prefixes
	// are ignored. Default outbox.
	MessagePrefix string `yaml:"message_prefix"`
}

// Messages reports whether events come from logical decoding messages
// (Source messages) rather than the outbox table.
func (w WAL) Messages() bool { return w.Source == "messages" }

// Sink selects and configures the broker.
type Sink struct {
	// Type is kafka, nats, pubsub, rabbitmq, redis, sqs or webhook.
	// Required.
	Type     string   `yaml:"type"`
	NATS     NATS     `yaml:"nats"`
	Kafka    Kafka    `yaml:"kafka"`
	PubSub   PubSub   `yaml:"pubsub"`
	RabbitMQ RabbitMQ `yaml:"rabbitmq"`
	Redis    Redis    `yaml:"redis"`
	SQS      SQS      `yaml:"sqs"`
	Webhook  Webhook  `yaml:"webhook"`
	// Envelope is none or cloudevents: CloudEvents 1.0, binary content
	// mode for kafka, nats and webhook, structured for sqs (see
	// docs/configuration.md, CloudEvents). Default none (also when empty):
	// the payload as it is, with the contract's headers only.
	Envelope    string      `yaml:"envelope"`
	CloudEvents CloudEvents `yaml:"cloudevents"`
	// Format is native or debezium: the message shape of Debezium's
	// outbox event router (see Debezium). Default native (also when
	// empty): the payload as it is, with the contract's headers.
	Format   string   `yaml:"format"`
	Debezium Debezium `yaml:"debezium"`
	// RateLimit caps how fast the relay publishes. Default unlimited.
	RateLimit RateLimit `yaml:"rate_limit"`
	// HeldMaxAge is how long a destination may stay broken before the
	// events it holds, and those routed to it while it stays broken, are
	// dead-lettered with the reason. Default 0: held as long as it lasts.
	HeldMaxAge Duration `yaml:"held_max_age"`
}

// CloudEvents configures the cloudevents envelope.
type CloudEvents struct {
	// Source is the prefix of every event's source attribute: a URI
	// reference without query or fragment, joined with the aggregate_type
	// by "/" (none when it ends in "/" or ":"). Required with envelope
	// cloudevents.
	Source string `yaml:"source"`
}

// RateLimit caps the events the relay publishes per second, across all
// destinations, so that draining a backlog does not overrun a receiver.
// Events waiting for the limit are not publish attempts: they are never
// retried or dead-lettered for it.
type RateLimit struct {
	// EventsPerSecond is the long-run rate. 0 means unlimited.
	EventsPerSecond int `yaml:"events_per_second"`
	// Burst is the most events published at once after an idle spell; it
	// also caps the events of one publish call. 0 means a tenth of
	// EventsPerSecond, at least 1.
	Burst int `yaml:"burst"`
}

// NATS configures the NATS JetStream sink. See sink/nats.
type NATS struct {
	// URL of the NATS server(s), comma separated. Default nats://127.0.0.1:4222.
	URL string `yaml:"url"`
	// Subject is the subject template. Default outbox.{aggregate_type}, or
	// DebeziumDestination with sink.format debezium.
	Subject string `yaml:"subject"`
	// Stream is the JetStream stream, created if missing. Default OUTBOX.
	Stream string `yaml:"stream"`
	// CredentialsFile is a NATS .creds file (user JWT and nkey seed), for
	// servers in operator (decentralized JWT) mode. At most one of
	// CredentialsFile, NKeyFile, Username and Token is set.
	CredentialsFile string `yaml:"credentials_file"`
	// NKeyFile is a file holding a user nkey seed (SU...), for servers
	// that list the user's public nkey.
	NKeyFile string `yaml:"nkey_file"`
	// Username and Password authenticate with a user and password; set
	// both or neither. Use ${VAR} for the password; it is never logged.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// Token authenticates with a token; it is never logged.
	Token string `yaml:"token"`
	// TLS configures encryption to the servers.
	TLS TLS `yaml:"tls"`
	// Replicas is the replica count of the stream the relay creates,
	// between 1 and 5. 0 means 1, applied by the sink.
	Replicas int `yaml:"replicas"`
	// Storage is the storage of the stream the relay creates: file or
	// memory. Empty means file, applied by the sink.
	Storage string `yaml:"storage"`
	// MaxAge, MaxBytes and MaxMsgs are the limits of the stream the relay
	// creates; at a limit the oldest messages are removed. 0 means
	// unlimited.
	MaxAge   Duration `yaml:"max_age"`
	MaxBytes int      `yaml:"max_bytes"`
	MaxMsgs  int      `yaml:"max_msgs"`
	// DuplicateWindow is how long the stream the relay creates remembers a
	// message_id (Nats-Msg-Id) to drop a second publish of it. 0 means
	// 2m, applied by the sink; at most MaxAge when that is set.
	DuplicateWindow Duration `yaml:"duplicate_window"`
}

// Kafka configures the Kafka sink. See sink/kafka.
type Kafka struct {
	// Brokers are the seed brokers, as host:port. Required for the kafka
	// sink.
	Brokers []string `yaml:"brokers"`
	// Topic is the topic template. A character Kafka does not allow in a
	// topic name (other than a-z A-Z 0-9 . _ -) in a replaced value becomes
	// '_'. Default outbox.{aggregate_type}, or DebeziumDestination with
	// sink.format debezium.
	Topic string `yaml:"topic"`
	// ClientID is the client.id the relay sends to the brokers, which shows
	// in their logs and quotas. Empty means outbox-relay, applied by the
	// sink.
	ClientID string `yaml:"client_id"`
	// Partitions is the partition count of the topics the relay creates
	// (`relay init` for a fixed topic, the first publish for a templated
	// one). 0 means the broker's num.partitions. Existing topics are never
	// changed.
	Partitions int `yaml:"partitions"`
	// ReplicationFactor is the replication factor of the topics the relay
	// creates. 0 means the broker's default.replication.factor.
	ReplicationFactor int `yaml:"replication_factor"`
	// TLS configures encryption to the brokers.
	TLS TLS `yaml:"tls"`
	// SASL configures authentication to the brokers.
	SASL KafkaSASL `yaml:"sasl"`
	// Transactional produces in Kafka transactions, so that consumers
	// reading with isolation.level=read_committed see each event once,
	// through crashes of the relay. Default false.
	Transactional bool `yaml:"transactional"`
	// Linger is how long a partition's records wait for more before they
	// are sent: the events of the publishes within one linger go in one
	// produce request. Zero means the sink's default, 5ms; at most
	// maxLinger.
	Linger Duration `yaml:"linger"`
}

// TLS configures TLS to a broker (sink.kafka.tls, sink.nats.tls).
type TLS struct {
	// Enabled turns TLS on. Default false; the other keys require it.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of the certificate authorities that sign the
	// servers' certificates. Empty means the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the PEM client certificate and key for
	// mutual TLS; set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// InsecureSkipVerify accepts any server certificate. For tests only.
	// Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// KafkaSASL configures SASL authentication to the Kafka brokers.
type KafkaSASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM (the
	// AWS SDK's default credential chain signs in; no username or
	// password) or OAUTHBEARER (a bearer token from TokenFile or
	// Password). Empty disables SASL.
	Mechanism string `yaml:"mechanism"`
	// Username is required with PLAIN and SCRAM.
	Username string `yaml:"username"`
	// Password is required with PLAIN and SCRAM; with OAUTHBEARER and no
	// TokenFile it is the bearer token. Use ${VAR} to keep it out of the
	// file; it is never logged.
	Password string `yaml:"password"`
	// TokenFile is, with OAUTHBEARER, a file holding the bearer token,
	// read again for every connection so that whatever refreshes it (a
	// sidecar, a projected service account token) is followed.
	TokenFile string `yaml:"token_file"`
}

// RabbitMQ configures the RabbitMQ sink. See sink/rabbitmq.
type RabbitMQ struct {
	// URL is the broker's amqp:// or amqps:// URL with the user, password
	// and virtual host, such as amqp://relay:${RABBITMQ_PASSWORD}@127.0.0.1:5672/.
	// Required. Use ${VAR} for the password; it is never logged.
	URL string `yaml:"url"`
	// Exchange is the exchange name template; "" publishes to the
	// default exchange, whose routing keys name queues. Default outbox.
	Exchange string `yaml:"exchange"`
	// RoutingKey is the routing key template. Default
	// {aggregate_type}.{event_type}.
	RoutingKey string `yaml:"routing_key"`
	// TLS configures encryption; an amqps:// URL turns it on with the
	// system's roots.
	TLS TLS `yaml:"tls"`
	// MaxMessageBytes is the largest payload the relay sends; a larger
	// event is dead-lettered without being sent. Set it to the broker's
	// max_message_size. 0 means 16777216 (RabbitMQ 4's default).
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// Declare makes relay init create the exchange when it is missing and
	// a quorum queue bound to it with "#" when that is missing, for a
	// quick start; existing ones are never changed. Requires an exchange
	// without placeholders. Default false.
	Declare bool `yaml:"declare"`
	// ExchangeType is the type of the exchange relay init creates: topic,
	// direct, fanout or headers. Default topic.
	ExchangeType string `yaml:"exchange_type"`
	// Queue names the quorum queue relay init creates. Default: the
	// exchange's name.
	Queue string `yaml:"queue"`
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
	// MaxBatchBytes caps the size of one SendMessageBatch request: message
	// bodies plus attribute names, types and values. Between 1024 and
	// 1048576; zero means 262144, which every SQS-compatible server
	// accepts (AWS itself takes 1048576).
	MaxBatchBytes int `yaml:"max_batch_bytes"`
	// RoleARN, when set, is an IAM role the relay assumes with STS
	// (AssumeRole) using the default chain's credentials, and whose
	// temporary credentials sign every SQS request; they are renewed
	// before they expire. Default empty: the default chain's credentials
	// sign the requests themselves.
	RoleARN string `yaml:"role_arn"`
	// ExternalID is the external id the role's trust policy may require.
	// Only with RoleARN.
	ExternalID string `yaml:"external_id"`
	// RoleSessionName names the assumed role's session in CloudTrail. Only
	// with RoleARN; default "outbox-relay".
	RoleSessionName string `yaml:"role_session_name"`
}

// PubSub configures the Google Cloud Pub/Sub sink.
type PubSub struct {
	// ProjectID is the Google Cloud project of the topics. Required.
	ProjectID string `yaml:"project_id"`
	// Topic is the topic ID template, such as "outbox.{aggregate_type}".
	// Required.
	Topic string `yaml:"topic"`
	// CredentialsFile is a credentials JSON file used instead of
	// Application Default Credentials. Default empty: ADC (GKE workload
	// identity, GOOGLE_APPLICATION_CREDENTIALS, the metadata server).
	CredentialsFile string `yaml:"credentials_file"`
	// Endpoint overrides the Pub/Sub endpoint, such as a regional one.
	// With PUBSUB_EMULATOR_HOST set, it overrides the emulator's address
	// (plain gRPC, no credentials).
	Endpoint string `yaml:"endpoint"`
	// PublishTimeout bounds one publish request. Default 30s.
	PublishTimeout Duration `yaml:"publish_timeout"`
	// BatchDelay is how long the client waits for more messages of an
	// ordering key before it sends them. At most 100ms. Default 1ms.
	BatchDelay Duration `yaml:"batch_delay"`
	// MaxPublishers is the most topic publishers kept open; the least
	// recently used idle one is stopped beyond it. Default 100.
	MaxPublishers int `yaml:"max_publishers"`
}

// Redis configures the Redis Streams sink. See sink/redis.
type Redis struct {
	// URL is redis://[user:password@]host:port/db, or rediss:// for TLS.
	// Default redis://127.0.0.1:6379/0. With ClusterAddrs its host is one
	// more seed node; with Sentinel only its scheme, credentials and
	// database count.
	URL string `yaml:"url"`
	// Stream is the stream name template. A character other than a-z A-Z
	// 0-9 . _ - : in a replaced value becomes '_'. Default
	// outbox.{aggregate_type}.
	Stream string `yaml:"stream"`
	// Username and Password replace those of the URL: an ACL user, or the
	// requirepass password alone. Use ${VAR}; they are never logged.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// TLS configures encryption; rediss:// turns it on with the system's
	// roots.
	TLS TLS `yaml:"tls"`
	// ClusterAddrs, when set, are host:port seed nodes of a Redis Cluster
	// besides the URL's host. Default empty: not a cluster.
	ClusterAddrs []string `yaml:"cluster_addrs"`
	// Sentinel, when its master is set, finds the master through Redis
	// Sentinel. Not with ClusterAddrs.
	Sentinel RedisSentinel `yaml:"sentinel"`
	// MaxLen, when positive, trims every stream to about that many entries
	// on each XADD (MAXLEN ~). Default 0: no trimming.
	MaxLen int `yaml:"max_len"`
}

// RedisSentinel names a master monitored by Redis Sentinel.
type RedisSentinel struct {
	// Master is the master's name. Required with Addrs.
	Master string `yaml:"master"`
	// Addrs are the Sentinels' host:port addresses. Required with Master.
	Addrs []string `yaml:"addrs"`
	// Username and Password authenticate to the Sentinels when they
	// require it; never logged.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// Webhook configures the webhook sink. See docs/webhook.md.
type Webhook struct {
	// URL is the URL template events are POSTed to: an absolute http or
	// https URL whose path and query may hold placeholders, which are
	// URL-escaped. Required for the webhook sink.
	URL string `yaml:"url"`
	// Timeout bounds one request: connecting, sending it and reading the
	// response. Default 5s.
	Timeout Duration `yaml:"timeout"`
	// Secret, when set, signs every request as Standard Webhooks does
	// (webhook-id, webhook-timestamp, webhook-signature): whsec_<base64>
	// or raw, at least 16 bytes. Use ${VAR} to keep it out of the file; it
	// is never logged. Default empty: requests are not signed.
	Secret string `yaml:"secret"`
	// Secrets, instead of Secret, lists several secrets, each read as
	// Secret is: every request carries one signature per secret,
	// space-separated, so the secret can be rotated without a moment when
	// a receiver holding either cannot verify. Default empty.
	Secrets []string `yaml:"secrets"`
	// Headers are added to every request, e.g. Authorization. They override
	// the row's headers and cannot set the contract headers, Content-Type,
	// the signature headers or hop-by-hop headers. Values are never logged.
	Headers map[string]string `yaml:"headers"`
	// MaxConcurrency caps the requests in flight at once. 0 means 64,
	// applied by the sink.
	MaxConcurrency int `yaml:"max_concurrency"`
	// HealthURL, when set, is an absolute http or https URL without
	// placeholders that the relay GETs, with the static headers, to check
	// the receiver while no events flow; a 2xx answer means ready. Default
	// empty: an idle receiver is not checked.
	HealthURL string `yaml:"health_url"`
}

// Archive says what happens to a row once its publish was acknowledged.
type Archive struct {
	// Mode is delete, mark, move or partition. Default delete. partition
	// (wal capture of an outbox table only) never deletes published rows:
	// the outbox is a ring of Partitions list partitions of PartitionRows
	// seqs each, and the relay truncates a partition once every row in it
	// was published or dead-lettered.
	Mode string `yaml:"mode"`
	// Table is the archive table for move. Default public.outbox_archive.
	Table string `yaml:"table"`
	// Retention, when set, prunes archived rows older than it (mark: rows
	// with published_at; move: rows of the archive table), checked every
	// minute. Default 0: keep them.
	Retention Duration `yaml:"retention"`
	// Partitions is the number of partitions of archive mode partition's
	// ring, 3 to 64. Default 8; only that mode takes it.
	Partitions int `yaml:"partitions"`
	// PartitionRows is how many consecutive seqs one partition of the ring
	// takes before the next one does, at least 1000. Default 100000; only
	// archive mode partition takes it.
	PartitionRows int `yaml:"partition_rows"`
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

// DeadLetter configures the dead-letter table.
type DeadLetter struct {
	// Table is the dead-letter table. Default public.outbox_dead_letter.
	Table string `yaml:"table"`
	// ParkAggregate, when true, holds an aggregate's later events in the
	// outbox while one of its events is dead-lettered, until that dead letter
	// is redriven or dropped. Default false: the aggregate continues with its
	// next event.
	ParkAggregate bool `yaml:"park_aggregate"`
}

// HTTP configures the metrics and health endpoint.
type HTTP struct {
	// Listen is the address of /metrics, /healthz and /readyz; empty
	// disables the server.
	Listen string `yaml:"listen"`
	// Advertise is the host:port other hosts reach Listen at, which the
	// relay publishes in its database sessions' application_name so that
	// relay status finds every relay. Default: Listen's host, or, when that
	// is a wildcard, the local IP address this host reaches Postgres from,
	// with Listen's port. At most 50 bytes; unused without Listen.
	Advertise string `yaml:"advertise"`
	// Pprof also serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on Listen. Default false: profiles reveal the
	// process's internals, so keep the listener private when on.
	Pprof bool `yaml:"pprof"`
}

// Log configures logging.
type Log struct {
	// Format is text or json. Default text.
	Format string `yaml:"format"`
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level"`
}

// Tracing configures OpenTelemetry spans. See docs/configuration.md.
type Tracing struct {
	// OTLPEndpoint is where spans are exported with OTLP: host:port for
	// OTLP/gRPC without TLS (e.g. 127.0.0.1:4317), or an http:// or
	// https:// URL for OTLP/HTTP (/v1/traces when the URL has no path).
	// Default empty: no spans are made or exported.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
}

// Duration is a time.Duration written as a Go duration string ("250ms").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

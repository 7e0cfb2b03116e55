// Package kafka publishes events to Apache Kafka with franz-go.
//
// Each event becomes one record on the topic rendered from the topic
// template: the record key is the aggregate ID, the value the payload bytes,
// and the headers message_id, event_type, aggregate_type, aggregate_id and
// content-type are set, after the row's own headers, which they override.
// The producer is idempotent and waits for acks from all in-sync replicas
// (acks=all). The first publish to a missing topic creates it. How order
// holds through the client's retries and timeouts is in docs/design.md.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	saslaws "github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Config says where and how a Sink connects and publishes. The relay fills
// it from the sink.kafka keys of its configuration file.
type Config struct {
	// Brokers are the seed brokers, as host:port. Required.
	Brokers []string
	// Topic is the topic template, such as outbox.{aggregate_type}. A
	// character Kafka does not allow in a topic name in a replaced value
	// becomes '_'. Required.
	Topic string
	// ClientID is the client.id sent to the brokers. Default outbox-relay.
	ClientID string
	// Partitions is the partition count of the topics the sink creates.
	// Default 0: the broker's num.partitions.
	Partitions int
	// ReplicationFactor is the replication factor of the topics the sink
	// creates. Default 0: the broker's default.replication.factor.
	ReplicationFactor int
	// TLS configures encryption to the brokers. Default off.
	TLS TLS
	// SASL configures authentication to the brokers. Default off.
	SASL SASL
	// Transactional produces in Kafka transactions under TransactionalID
	// and records progress in ProgressTopic, so that read_committed
	// consumers see each event once (see txn.go). Default false.
	Transactional bool
	// TransactionalID is the transactional id: one per relay that
	// publishes, stable across restarts, so that a restarted relay fences
	// its predecessor. Required when Transactional.
	TransactionalID string
}

// TLS configures TLS to the brokers (see sink.TLS).
type TLS = sink.TLS

// SASL configures SASL authentication to the brokers.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM or
	// OAUTHBEARER. Default empty: no SASL.
	Mechanism string
	// Username and Password are the credentials for PLAIN and SCRAM; with
	// OAUTHBEARER and no TokenFile, Password is the bearer token. The sink
	// never logs the password.
	Username string
	Password string
	// TokenFile holds OAUTHBEARER's token; it is read for every
	// connection.
	TokenFile string
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// AckTimeout bounds how long Publish waits for a batch's
	// acknowledgements, including any wait for room in the client's buffer.
	// Events not acknowledged by then fail as fault.Unavailable; see the
	// docs/design.md (Kafka) for why that keeps per-aggregate order. It is
	// also how long a publish takes to report a broker that cannot be
	// reached at all. Default 15s, a little over ProduceRequestTimeout's
	// default.
	AckTimeout time.Duration
	// MaxBufferedRecords caps the records buffered in the client and not
	// yet acknowledged, across all concurrent Publish calls; a publish that
	// finds the buffer full waits for room. Set it to the pipeline's window
	// (the most events held between capture and archive). Default 10000.
	MaxBufferedRecords int
	// Linger is how long a partition waits for more records before its
	// batch is sent, trading a little latency for fewer, larger produce
	// requests when many Publish calls run at once. Default 5ms.
	Linger time.Duration
	// ProduceRequestTimeout is how long a broker may take to answer a
	// produce request, which with acks=all includes replicating it to the
	// in-sync replicas. Default 10s.
	ProduceRequestTimeout time.Duration
	// Logger receives the client's warnings and errors, topic creation, and
	// a warning for SASL PLAIN without TLS. Default slog.Default().
	Logger *slog.Logger
	// Envelope, when set, adds the CloudEvents attributes to every record
	// as ce_ headers (binary content mode). Default nil: no envelope.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward (see sink.HeaderFilter). Default: counters of the sink's
	// own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	if o.AckTimeout <= 0 {
		o.AckTimeout = 15 * time.Second
	}
	if o.MaxBufferedRecords <= 0 {
		o.MaxBufferedRecords = 10000
	}
	if o.Linger <= 0 {
		o.Linger = 5 * time.Millisecond
	}
	if o.ProduceRequestTimeout <= 0 {
		o.ProduceRequestTimeout = 10 * time.Second
	}
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

// Connection settings.
const (
	// defaultClientID is the client.id when sink.kafka.client_id is empty.
	defaultClientID = "outbox-relay"
	// connectTimeout bounds New's first contact with the cluster and each
	// dial.
	connectTimeout = 5 * time.Second
	// adminTimeout bounds the broker side of topic creation.
	adminTimeout = 15 * time.Second
	// checkTimeout bounds Check when its context has no earlier deadline.
	checkTimeout = 15 * time.Second
	// defaultMaxMessageBytes is the batch size limit assumed for a topic
	// whose max.message.bytes cannot be read: franz-go's default, a little
	// below Kafka's own default of 1048588, so the guess errs on the side
	// of rejecting in the client.
	defaultMaxMessageBytes = 1000012
)

// Sink publishes events to Kafka. It implements sink.Sink; its methods are
// safe for concurrent use.
type Sink struct {
	cfg   Config
	opts  Options
	topic template.Template
	fixed bool // the template has no placeholders
	rows  *sink.HeaderFilter
	cl    *kgo.Client
	adm   *kadm.Client

	// limits maps a topic to its max.message.bytes, read before the first
	// produce to the topic; the client reads it when it first meets a
	// partition of the topic.
	limits sync.Map // string -> int32

	mu     sync.Mutex
	topics map[string]*topicState // topics being or done being prepared

	lastErr atomic.Pointer[brokerErr] // the last failed connection attempt

	txn *txns // nil unless cfg.Transactional

	alone *loner // republishes the records of rejected batches one by one

	// runBreaks counts the runs whose acknowledged records were not stored
	// as one batch (see checkRuns).
	runBreaks atomic.Int64
	// onAck, when set, sees every record the broker acknowledged to
	// Publish before checkRuns does; tests set it to alter what the broker
	// reported. Nil in the relay.
	onAck func(*kgo.Record)

	closeOnce sync.Once
	closed    chan struct{}
}

// brokerErr is a failed connection attempt, kept to explain timeouts.
type brokerErr struct {
	broker string
	err    error
	at     time.Time
}

// New returns a sink producing to cfg.Brokers, to topics rendered from
// cfg.Topic. It fails on a topic template whose literal text Kafka does not
// allow, on TLS files that cannot be loaded, and, with an error classified
// fault.Unavailable, when no broker answers before ctx is done or 5s pass.
// New neither checks nor creates topics; see EnsureTopics and Check.
func New(ctx context.Context, cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink.kafka.brokers: no brokers")
	}
	if err := destname.KafkaTopicTemplate(cfg.Topic); err != nil {
		return nil, fmt.Errorf("sink.kafka.topic: %w", err)
	}
	topic, err := template.Parse(cfg.Topic, sanitize)
	if err != nil {
		return nil, fmt.Errorf("sink.kafka.topic: %w", err)
	}
	topic = topic.Limit(destname.MaxKafkaTopic)
	s := &Sink{
		cfg:    cfg,
		opts:   opts,
		topic:  topic,
		fixed:  !strings.Contains(cfg.Topic, "{"),
		rows:   sink.NewHeaderFilter(sink.KafkaRules, envelope.Kafka.ReservedPrefix(opts.Envelope), opts.HeaderDrops),
		topics: make(map[string]*topicState),
		alone:  newLoner(),
		closed: make(chan struct{}),
	}
	if cfg.Transactional {
		if cfg.TransactionalID == "" {
			return nil, errors.New("sink.kafka: transactions need a transactional id")
		}
		s.txn = newTxns(s)
	}
	kopts, err := s.clientOptions("")
	if err != nil {
		return nil, err
	}
	s.cl, err = kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	s.adm = kadm.NewClient(s.cl)
	s.adm.SetTimeoutMillis(int32(adminTimeout / time.Millisecond))
	if err := s.ping(ctx); err != nil {
		s.cl.Close()
		return nil, err
	}
	return s, nil
}

// clientOptions translates the config and options to franz-go's, for a
// transactional producer with id txnID unless it is empty. The sink's own
// client is never transactional (see txn.go for the producer of
// transactions), so that admin requests and Check fence nobody.
func (s *Sink) clientOptions(txnID string) ([]kgo.Opt, error) {
	kopts, err := s.connOptions()
	if err != nil {
		return nil, err
	}
	kopts = append(kopts,
		kgo.WithHooks(connectHook{s}),
		// Idempotent writes are franz-go's default; they are spelled out
		// by never passing DisableIdempotentWrite or
		// AllowIdempotentProduceCancellation.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(s.opts.Linger),
		kgo.MaxBufferedRecords(s.opts.MaxBufferedRecords),
		kgo.ProduceRequestTimeout(s.opts.ProduceRequestTimeout),
		kgo.ProducerBatchMaxBytesFn(s.maxMessageBytes),
		kgo.RecordPartitioner(runPartitioner{}),
	)
	if txnID != "" {
		kopts = append(kopts, kgo.TransactionalID(txnID))
	}
	return kopts, nil
}

// connOptions are the options of every client of the sink: brokers,
// client id, TLS and SASL.
func (s *Sink) connOptions() ([]kgo.Opt, error) {
	clientID := s.cfg.ClientID
	if clientID == "" {
		clientID = defaultClientID
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID(clientID),
		kgo.DialTimeout(connectTimeout),
		kgo.WithLogger(newLogger(s.opts.Logger)),
	}
	tc, err := tlsConfig(s.cfg.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		kopts = append(kopts, kgo.DialTLSConfig(tc))
	}
	mech, err := saslMechanism(s.cfg.SASL)
	if err != nil {
		return nil, err
	}
	if mech != nil {
		kopts = append(kopts, kgo.SASL(mech))
		if mech.Name() == "PLAIN" && tc == nil {
			s.opts.Logger.Warn("kafka: SASL PLAIN without TLS sends the password in clear text; set sink.kafka.tls.enabled")
		}
	}
	return kopts, nil
}

// ping checks that a broker answers, within connectTimeout.
func (s *Sink) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	err := s.cl.Ping(ctx)
	if err == nil {
		return nil
	}
	err = fmt.Errorf("connect to kafka %s: %w", s.brokers(), s.explain(err))
	if isAuthError(err) {
		return fmt.Errorf("%w; check sink.kafka.sasl and sink.kafka.tls", err)
	}
	return fault.AsUnavailable(fmt.Errorf("%w; check sink.kafka.brokers, sink.kafka.tls and sink.kafka.sasl, and that the brokers run", err))
}

// brokers lists the seed brokers for messages.
func (s *Sink) brokers() string { return strings.Join(s.cfg.Brokers, ",") }

// explain adds the last failed connection attempt to err, which says only
// that a deadline passed, when it happened after the caller started
// waiting.
func (s *Sink) explain(err error) error {
	le := s.lastErr.Load()
	if le == nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(le.at) > s.opts.AckTimeout+connectTimeout {
		return err
	}
	return fmt.Errorf("%w (last connection attempt to %s: %v)", err, le.broker, le.err)
}

// tlsConfig builds the TLS settings, or returns nil when TLS is off.
func tlsConfig(c TLS) (*tls.Config, error) {
	return tlsconf.Config("sink.kafka.tls", c)
}

// saslMechanism returns the SASL mechanism, or nil when SASL is off.
func saslMechanism(c SASL) (sasl.Mechanism, error) {
	switch c.Mechanism {
	case "":
		return nil, nil
	case "PLAIN":
		return plain.Auth{User: c.Username, Pass: c.Password}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: c.Username, Pass: c.Password}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: c.Username, Pass: c.Password}.AsSha512Mechanism(), nil
	case "AWS_MSK_IAM":
		return mskIAM()
	case "OAUTHBEARER":
		return oauth.Oauth(func(context.Context) (oauth.Auth, error) { return bearer(c) }), nil
	}
	return nil, fmt.Errorf("sink.kafka.sasl.mechanism: %q is not PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, AWS_MSK_IAM or OAUTHBEARER", c.Mechanism)
}

// mskIAM returns Amazon MSK's IAM mechanism with credentials from the AWS
// SDK's default chain (environment, shared files, web identity, ECS and EC2
// roles), which the SDK caches and refreshes; each connection signs with
// the current ones. The region is the broker host's, else AWS_REGION.
func mskIAM() (sasl.Mechanism, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(context.Background())
	if err != nil {
		return nil, fmt.Errorf("sink.kafka.sasl.mechanism AWS_MSK_IAM: load AWS credentials: %w", err)
	}
	return saslaws.ManagedStreamingIAM(func(ctx context.Context) (saslaws.Auth, error) {
		c, err := awsCfg.Credentials.Retrieve(ctx)
		if err != nil {
			return saslaws.Auth{}, fmt.Errorf("AWS credentials: %w", err)
		}
		return saslaws.Auth{AccessKey: c.AccessKeyID, SecretKey: c.SecretAccessKey, SessionToken: c.SessionToken,
			UserAgent: "outbox-relay"}, nil
	}), nil
}

// bearer returns OAUTHBEARER's token: TokenFile's content, read now, or
// else Password.
func bearer(c SASL) (oauth.Auth, error) {
	if c.TokenFile == "" {
		return oauth.Auth{Token: c.Password}, nil
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return oauth.Auth{}, fmt.Errorf("sink.kafka.sasl.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return oauth.Auth{}, fmt.Errorf("sink.kafka.sasl.token_file %s is empty", c.TokenFile)
	}
	return oauth.Auth{Token: tok}, nil
}

// sanitize maps a rune of a template value that Kafka does not allow in a
// topic name (anything but a-z A-Z 0-9 . _ -) to '_'.
func sanitize(r rune) rune {
	if destname.KafkaTopicRune(r) {
		return r
	}
	return '_'
}

// topicOf renders e's topic: the template with sanitized values, cut to
// Kafka's limit when the template's literal text leaves room, with "." and
// ".." (possible only from a template that is a bare placeholder) replaced
// by underscores and the value's template.Hash.
func (s *Sink) topicOf(e *event.Event) string {
	name := s.topic.Render(e)
	if name == "." || name == ".." {
		name = strings.Repeat("_", len(name)) + template.Hash(name)
	}
	return name
}

// FixedTopic returns the topic of a template without placeholders, or ""
// when the topic depends on the event.
func (s *Sink) FixedTopic() string {
	if s.fixed {
		return s.cfg.Topic
	}
	return ""
}

// Close closes the client. Publish calls waiting for acknowledgements fail
// at once with an error classified fault.Unavailable; records still buffered
// are failed. Close is idempotent and always returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.cl.Close()
		s.alone.close()
		if s.txn != nil {
			s.txn.stop()
		}
	})
	return nil
}

// connectHook remembers the last failed connection attempt.
type connectHook struct{ s *Sink }

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (h connectHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		h.s.lastErr.Store(nil)
		return
	}
	h.s.lastErr.Store(&brokerErr{broker: net.JoinHostPort(meta.Host, fmt.Sprint(meta.Port)), err: err, at: time.Now()})
}

// logEvery is the shortest interval between two logs of one franz-go
// message, which it repeats on every retry while a broker is down.
const logEvery = 30 * time.Second

// logger passes franz-go's warnings and errors to slog, each message at
// most once per logEvery.
type logger struct {
	l    *slog.Logger
	last *sync.Map // message -> time.Time of its last log
}

func newLogger(l *slog.Logger) logger { return logger{l: l, last: new(sync.Map)} }

// Level implements kgo.Logger.
func (l logger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

// Log implements kgo.Logger.
func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	now := time.Now()
	if prev, ok := l.last.Load(msg); ok && now.Sub(prev.(time.Time)) < logEvery {
		return
	}
	l.last.Store(msg, now)
	lvl := slog.LevelWarn
	if level == kgo.LogLevelError {
		lvl = slog.LevelError
	}
	l.l.Log(context.Background(), lvl, "kafka: "+msg, keyvals...)
}

// isAuthError reports whether err is a failed authentication or a TLS or
// SASL mismatch, which retrying does not fix.
func isAuthError(err error) bool {
	var eof *kgo.ErrFirstReadEOF
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.IllegalSaslState) ||
		errors.Is(err, kerr.UnsupportedSaslMechanism) || errors.As(err, &eof)
}

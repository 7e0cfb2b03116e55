// Package redis appends events to Redis Streams with XADD.
//
// Each event becomes one stream entry, with an entry id Redis assigns
// ("*"), in the stream rendered from the stream template. The entry's
// fields are message_id, event_type, aggregate_type, aggregate_id,
// content_type (when known), the CloudEvents ce_ attributes with that
// envelope, the row's headers that the sink forwards, in name order, and
// last payload, the payload bytes. docs/reference.md documents the layout
// and why entry ids are not taken from the events.
//
// One Publish call sends its XADD commands in one pipeline, in batch order;
// a Redis Cluster client splits it by node, keeping each stream's order.
// Redis does not deduplicate: an XADD whose reply was lost is sent again by
// the pipeline's retry and stored twice, with the same message_id, and
// consumers deduplicate on it. Failures are classified by classify.
package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Config says where a Sink publishes. The relay fills it from the sink.redis
// keys of its configuration file.
type Config struct {
	// URL is redis://[user:password@]host:port/db, or rediss:// for TLS
	// with the system's roots. Required. With ClusterAddrs its host is one
	// of the cluster's seed nodes; with Sentinel its host is ignored and it
	// gives the scheme, the credentials and the database only.
	URL string
	// Stream is the stream name template, such as outbox.{aggregate_type}.
	// Required.
	Stream string
	// Username and Password, when set, replace those of the URL (an ACL
	// user, or the requirepass password with an empty Username). They are
	// never logged.
	Username, Password string
	// TLS configures encryption. Default: on with the system's roots for
	// rediss://, else off.
	TLS sink.TLS
	// ClusterAddrs, when set, makes the sink a Redis Cluster client with
	// these host:port seed nodes besides the URL's. Default empty.
	ClusterAddrs []string
	// Sentinel, when its Master is set, makes the sink find the master
	// through Redis Sentinel. Default: no Sentinel.
	Sentinel Sentinel
	// MaxLen, when positive, trims each stream to about that many entries
	// on every XADD (MAXLEN ~). Default 0: no trimming.
	MaxLen int64
}

// Sentinel names a master monitored by Redis Sentinel.
type Sentinel struct {
	// Master is the master's name in the Sentinel configuration.
	Master string
	// Addrs are the Sentinels' host:port addresses. Required with Master.
	Addrs []string
	// Username and Password authenticate to the Sentinels, when they
	// require it. Never logged.
	Username, Password string
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// Timeout bounds each read and write of a connection, so that a
	// server that stops answering fails a Publish after about that long.
	// Default 10s. A context deadline shortens it.
	Timeout time.Duration
	// Logger receives dropped row headers. Default slog.Default().
	Logger *slog.Logger
	// Envelope, when set, adds the CloudEvents attributes as ce_ fields
	// (binary content mode, like Kafka headers). Default nil.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward. Default: counters of the sink's own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

func init() { goredis.SetLogger(libLog{}) }

// libLog passes go-redis's own log lines (pool and connection events) to
// slog.Default at debug level, with credentials hidden.
type libLog struct{}

// Printf logs one line of go-redis.
func (libLog) Printf(ctx context.Context, format string, v ...any) {
	slog.Default().DebugContext(ctx, "redis client", slog.String("detail", redact.String(fmt.Sprintf(format, v...))))
}

// defaultMaxBulk is Redis's default proto-max-bulk-len, the largest
// argument of a command it reads, assumed when CONFIG GET is not allowed.
const defaultMaxBulk = 512 << 20

// minMaxBulk is the least proto-max-bulk-len Redis can be set to.
const minMaxBulk = 1 << 20

// Sink appends events to Redis Streams. It implements sink.Sink and
// sink.Destinations; its methods are safe for concurrent use.
type Sink struct {
	cfg    Config
	opts   Options
	client goredis.UniversalClient
	stream template.Template
	rows   *sink.HeaderFilter
	// user is the ACL user the sink authenticates as, for relay check.
	user string
	// where describes the servers, without credentials.
	where string
	// maxBulk is the server's proto-max-bulk-len, 0 until read.
	maxBulk atomic.Int64

	mu        sync.Mutex     // orders abandoned.Add before Close's Wait
	closed    atomic.Bool    // set by Close, under mu
	abandoned sync.WaitGroup // pipelines a cancelled Publish left running
}

// New returns a sink for cfg. It connects lazily: New fails only on a bad
// URL, template or TLS setting, never because Redis is unreachable (see
// Check).
func New(cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	if cfg.Stream == "" {
		return nil, errors.New("sink.redis.stream: required")
	}
	tmpl, err := template.Parse(cfg.Stream, sanitize)
	if err != nil {
		return nil, fmt.Errorf("sink.redis.stream: %w", err)
	}
	uo, err := universalOptions(cfg, opts)
	if err != nil {
		return nil, err
	}
	s := &Sink{cfg: cfg, opts: opts, stream: tmpl.Limit(destname.MaxRedisStream),
		rows: sink.NewHeaderFilter(sink.RedisRules, envelope.Kafka.ReservedPrefix(opts.Envelope), opts.HeaderDrops),
		user: uo.Username, where: describe(cfg, uo)}
	if s.user == "" {
		s.user = "default"
	}
	s.client = goredis.NewUniversalClient(uo)
	return s, nil
}

// universalOptions maps cfg to go-redis options: no retries of its own (the
// pipeline retries, and a retried pipeline would repeat entries), one dial
// attempt, opts.Timeout on reads and writes, context deadlines honoured.
func universalOptions(cfg Config, opts Options) (*goredis.UniversalOptions, error) {
	if cfg.URL == "" {
		return nil, errors.New("sink.redis.url: required, such as redis://127.0.0.1:6379/0")
	}
	o, err := goredis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink.redis.url: %w", redact.Error(err))
	}
	if cfg.Username != "" {
		o.Username = cfg.Username
	}
	if cfg.Password != "" {
		o.Password = cfg.Password
	}
	tc, err := tlsconf.Config("sink.redis.tls", cfg.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		o.TLSConfig = tc
	}
	uo := &goredis.UniversalOptions{
		Addrs: []string{o.Addr}, DB: o.DB, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		MaxRetries: -1, DialTimeout: 5 * time.Second, DialerRetries: 1,
		ReadTimeout: opts.Timeout, WriteTimeout: opts.Timeout, ContextTimeoutEnabled: true,
		DisableIdentity: true,
	}
	switch {
	case cfg.Sentinel.Master != "" && len(cfg.ClusterAddrs) > 0:
		return nil, errors.New("sink.redis: set either cluster_addrs or sentinel, not both")
	case cfg.Sentinel.Master != "":
		if len(cfg.Sentinel.Addrs) == 0 {
			return nil, errors.New("sink.redis.sentinel.addrs: required with sink.redis.sentinel.master")
		}
		uo.MasterName, uo.Addrs = cfg.Sentinel.Master, cfg.Sentinel.Addrs
		uo.SentinelUsername, uo.SentinelPassword = cfg.Sentinel.Username, cfg.Sentinel.Password
	case len(cfg.ClusterAddrs) > 0:
		if o.DB != 0 {
			return nil, fmt.Errorf("sink.redis.url: database %d: a Redis Cluster has database 0 only", o.DB)
		}
		uo.Addrs, uo.IsClusterMode = append(uo.Addrs, cfg.ClusterAddrs...), true
	}
	return uo, nil
}

// describe names the servers of uo and the stream template for logs and
// relay check, without credentials.
func describe(cfg Config, uo *goredis.UniversalOptions) string {
	scheme := "redis"
	if uo.TLSConfig != nil {
		scheme = "rediss"
	}
	switch {
	case uo.MasterName != "":
		return fmt.Sprintf("redis master %s via sentinels %v, db %d, streams %s", uo.MasterName, uo.Addrs, uo.DB, cfg.Stream)
	case uo.IsClusterMode:
		return fmt.Sprintf("redis cluster %s://%v, streams %s", scheme, uo.Addrs, cfg.Stream)
	}
	u := url.URL{Scheme: scheme, Host: uo.Addrs[0], Path: fmt.Sprint("/", uo.DB)}
	return fmt.Sprintf("redis %s, streams %s", u.String(), cfg.Stream)
}

// Destination describes where the sink publishes, without credentials.
func (s *Sink) Destination() string { return s.where }

// sanitize maps a rune of a template value that the relay does not keep in
// a stream name to '_' (see destname.RedisStreamRune).
func sanitize(r rune) rune {
	if destname.RedisStreamRune(r) {
		return r
	}
	return '_'
}

// errClosed fails the publishes of a closed sink.
var errClosed = errors.New("redis sink closed")

// Close closes the connections, failing in-flight publishes, and waits
// for the pipelines that cancelled publishes left running. It is
// idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	was := s.closed.Swap(true)
	s.mu.Unlock()
	if was {
		return nil
	}
	err := s.client.Close()
	s.abandoned.Wait()
	return err
}

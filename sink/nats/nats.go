// Package nats publishes events to a NATS JetStream stream.
//
// Each event becomes one message on the subject rendered from the subject
// template, with the payload as body and the headers Nats-Msg-Id and
// message_id set to the event ID, so JetStream drops a redelivery that
// arrives within the stream's duplicate window.
package nats

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Config says where a Sink publishes. The relay fills it from the sink.nats
// keys of its configuration file, which apply the defaults.
type Config struct {
	// URL lists the NATS servers, comma separated. Required.
	URL string
	// Subject is the subject template, such as outbox.{aggregate_type}.
	// Required.
	Subject string
	// Stream is the JetStream stream that EnsureStream creates and Check
	// verifies. Required for them.
	Stream string
	// Auth says how the sink authenticates. Default: as the URL says
	// (user:password@ or token@ in it), else anonymously.
	Auth Auth
	// TLS configures encryption to the servers. Default off, unless the
	// URL's scheme is tls:// or the server requires TLS: then with the
	// system's roots.
	TLS sink.TLS
	// StreamSettings are the settings of a stream EnsureStream creates.
	StreamSettings StreamSettings
}

// Auth holds the credentials of a NATS user; at most one way is set.
// None of them is ever logged.
type Auth struct {
	// CredentialsFile is a .creds file holding a user JWT and nkey seed,
	// for servers in operator (JWT) mode.
	CredentialsFile string
	// NKeyFile is a file holding a user nkey seed (SU...).
	NKeyFile string
	// Username and Password are a user and password.
	Username, Password string
	// Token is an authentication token.
	Token string
}

// StreamSettings are the settings of a stream EnsureStream creates. The
// zero value is one replica, file storage, no limits and a 2 minute
// duplicate window.
type StreamSettings struct {
	// Replicas is the number of copies of each message in a cluster.
	// Default 1.
	Replicas int
	// Memory keeps the messages in memory instead of files: faster, but
	// lost when every replica restarts. Default false.
	Memory bool
	// MaxAge, MaxBytes and MaxMsgs limit the stream; at a limit the oldest
	// messages are removed. Default 0: no limit.
	MaxAge   time.Duration
	MaxBytes int64
	MaxMsgs  int64
	// DuplicateWindow is how long the stream remembers a Nats-Msg-Id to
	// drop another message with it. Default 2m.
	DuplicateWindow time.Duration
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// MaxInFlight caps the messages published but not yet acknowledged,
	// across all concurrent Publish calls. A publish that finds the window
	// full waits for a free slot until AckTimeout after the call began,
	// then fails its remaining messages. Default 4096.
	MaxInFlight int
	// AckTimeout bounds one Publish call's waits: for room in the window,
	// counted from the start of the call, and for the PubAcks, counted from
	// its last send. Default 5s.
	AckTimeout time.Duration
	// Logger receives connection events (disconnects, reconnects,
	// asynchronous errors) and stream creation. Default slog.Default().
	Logger *slog.Logger
	// Envelope, when set, adds the CloudEvents attributes to every message
	// as ce- headers (binary content mode). Default nil: no envelope.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward (see sink.HeaderFilter). Default: counters of the sink's
	// own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 4096
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 5 * time.Second
	}
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

// Connection settings. Reconnects never stop, not even when the server
// refuses the credentials again and again (they may be fixed on the server
// while the relay waits), and the reconnect buffer is disabled: while the
// connection is down a publish fails at once and the pipeline retries it,
// instead of a buffered copy surfacing after the event was already given up
// on.
const (
	clientName     = "outbox-relay"
	reconnectWait  = 250 * time.Millisecond
	connectTimeout = 5 * time.Second
	pingInterval   = 10 * time.Second
	// duplicateWindow is the default duplicate window of a stream
	// EnsureStream creates.
	duplicateWindow = 2 * time.Minute
)

// Sink publishes events to JetStream. It implements sink.Sink; its methods
// are safe for concurrent use.
type Sink struct {
	cfg     Config
	opts    Options
	subject template.Template
	pattern string // the stream subject covering every rendered subject
	rows    *sink.HeaderFilter
	nc      *nats.Conn
	js      jetstream.JetStream
	acks    *acker
	// calls holds the state of ended Publish calls for the next ones. It
	// is the sink's own: a header map holds the names rows forwards.
	calls sync.Pool

	closeOnce sync.Once
	closed    chan struct{}
}

// New connects to the NATS servers of cfg.URL and returns a sink publishing
// to subjects rendered from cfg.Subject, authenticating and encrypting as
// cfg.Auth and cfg.TLS say. It fails on a subject template that cannot yield
// valid subjects, on a credentials, nkey or TLS file that cannot be read
// (naming its configuration key), and with an error classified
// fault.Unavailable when no server can be reached or the server refuses the
// credentials before ctx is done or 5s pass. New neither checks nor creates
// the stream; see EnsureStream and Check.
func New(ctx context.Context, cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	subject, err := template.Parse(cfg.Subject, sanitize)
	if err != nil {
		return nil, fmt.Errorf("sink.nats.subject: %w", err)
	}
	subject = subject.Limit(destname.MaxNATSSubject)
	pattern, err := subjectPattern(cfg.Subject)
	if err != nil {
		return nil, fmt.Errorf("sink.nats.subject: %w", err)
	}
	secure, err := securityOptions(cfg)
	if err != nil {
		return nil, err
	}
	nc, err := connect(ctx, cfg.URL, opts.Logger, secure)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	closed := make(chan struct{})
	acks, err := newAcker(nc, opts.MaxInFlight, closed)
	if err != nil {
		nc.Close()
		return nil, fault.AsUnavailable(fmt.Errorf("nats: subscribe to PubAcks: %w", err))
	}
	return &Sink{
		cfg:     cfg,
		opts:    opts,
		subject: subject,
		pattern: pattern,
		rows:    sink.NewHeaderFilter(sink.NATSRules, envelope.NATS.ReservedPrefix(opts.Envelope), opts.HeaderDrops),
		nc:      nc,
		js:      js,
		acks:    acks,
		closed:  closed,
	}, nil
}

// securityOptions returns the connect options of cfg's credentials and
// TLS settings. It fails, naming the key, when a file cannot be read.
func securityOptions(cfg Config) ([]nats.Option, error) {
	var opts []nats.Option
	switch a := cfg.Auth; {
	case a.CredentialsFile != "":
		if _, err := os.Stat(a.CredentialsFile); err != nil {
			return nil, fmt.Errorf("sink.nats.credentials_file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.CredentialsFile))
	case a.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("sink.nats.nkey_file: %w", err)
		}
		opts = append(opts, opt)
	case a.Username != "":
		opts = append(opts, nats.UserInfo(a.Username, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	}
	tc, err := tlsconf.Config("sink.nats.tls", cfg.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func connect(ctx context.Context, url string, log *slog.Logger, extra []nats.Option) (*nats.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fault.AsUnavailable(redact.Error(fmt.Errorf("connect to nats %s: %w", redact.String(url), err)))
	}
	timeout := connectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	var last atomic.Pointer[string] // the last asynchronous error logged
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(clientName),
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectBufSize(-1),
		nats.IgnoreAuthErrorAbort(),
		nats.PingInterval(pingInterval),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil { // a deliberate Close
				return
			}
			log.Warn("nats disconnected", "url", redact.String(url), "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			last.Store(nil)
			log.Info("nats reconnected", "server", redact.String(nc.ConnectedUrl()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// Refused credentials come back on every reconnect attempt:
			// warn once, then at debug level until the connection is back.
			lvl, msg := slog.LevelWarn, err.Error()
			if prev := last.Swap(&msg); prev != nil && *prev == msg {
				lvl = slog.LevelDebug
			}
			log.Log(context.Background(), lvl, "nats error", "err", err)
		}),
	}, extra...)...)
	if err != nil {
		return nil, fault.AsUnavailable(redact.Error(fmt.Errorf("connect to nats %s: %w", redact.String(url), err)))
	}
	return nc, nil
}

// sanitize maps a rune of a template value that a subject token cannot hold
// (the separator ".", the wildcards "*" and ">", whitespace and control
// characters) to '_'.
func sanitize(r rune) rune {
	if r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r) {
		return '_'
	}
	return r
}

// subjectPattern returns the subject filter covering every subject tmpl can
// render: each token holding a placeholder becomes "*". It fails on an empty
// token, a literal character not allowed in a subject token, or literal
// text longer than destname.MaxNATSSubject.
func subjectPattern(tmpl string) (string, error) {
	literal := tmpl
	for _, p := range template.Placeholders {
		literal = strings.ReplaceAll(literal, p, "")
	}
	if len(literal) > destname.MaxNATSSubject {
		return "", fmt.Errorf("template %.64q…: a subject has at most %d bytes", tmpl, destname.MaxNATSSubject)
	}
	tokens := strings.Split(tmpl, ".")
	for i, tok := range tokens {
		literal := tok
		for _, p := range template.Placeholders {
			literal = strings.ReplaceAll(literal, p, "")
		}
		if tok == "" || strings.Map(sanitize, literal) != literal {
			return "", fmt.Errorf("template %q: token %q is not a valid NATS subject token", tmpl, tok)
		}
		if literal != tok {
			tokens[i] = "*"
		}
	}
	return strings.Join(tokens, "."), nil
}

// Close closes the connection. Publish calls waiting for acknowledgements
// fail at once with an error classified fault.Unavailable. Close is
// idempotent and always returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.nc.Close()
	})
	return nil
}

// Package rabbitmq publishes events to RabbitMQ exchanges over AMQP 0-9-1
// with publisher confirms.
//
// Each event becomes one persistent message published with the mandatory
// flag to the exchange and routing key rendered from their templates: the
// payload as body, the event ID as the message_id property and header,
// the event's content type as the content_type property, and the contract
// headers and the forwarded row headers as AMQP headers (long strings).
// An event is published when the broker confirmed it (basic.ack). A
// message the broker returns as unroutable (basic.return, which comes
// before the confirm of the same message), a missing exchange, refused
// credentials or permissions and a lost connection are the destination's
// fault; a message over the broker's size limits is the event's. See
// classify.
//
// The sink keeps one connection, dialled when first needed and again
// after it is lost, and a few channels on it in confirm mode; the events
// of one exchange always go over the same channel. Connection recovery is
// the sink's own: amqp091-go does not reconnect.
package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Limits of AMQP 0-9-1 and RabbitMQ.
const (
	// maxShortStr is the longest short string: exchange names, routing
	// keys, header names, message_id and content_type.
	maxShortStr = 255
	// maxExchange is the longest exchange name the sink renders: the
	// AMQP specification's 127.
	maxExchange = 127
	// DefaultMaxMessageBytes is the default of Config.MaxMessageBytes:
	// the default max_message_size of RabbitMQ 4 (16 MiB; RabbitMQ 3
	// allows 128 MiB).
	DefaultMaxMessageBytes = 16 << 20
)

// Config says where a Sink publishes. The relay fills it from the
// sink.rabbitmq keys of its configuration file.
type Config struct {
	// URL is the broker's amqp:// or amqps:// URL, with the user, password
	// and virtual host. Required. It is never logged with its password.
	URL string
	// Exchange is the exchange name template; "" is the default exchange
	// (the routing key names a queue). Literal text may hold letters,
	// digits, '-', '_', '.' and ':'; other runes of a placeholder's value
	// become '_'.
	Exchange string
	// RoutingKey is the routing key template, such as
	// "{aggregate_type}.{event_type}". A '.' in a placeholder's value
	// becomes '_', so a value never adds words to a topic routing key.
	RoutingKey string
	// TLS configures encryption. Default off, unless the URL's scheme is
	// amqps: then with the system's roots.
	TLS sink.TLS
	// MaxMessageBytes is the largest body the sink sends; a larger event
	// fails as the event's fault without being sent. Zero means
	// DefaultMaxMessageBytes; set it to the broker's max_message_size when
	// that is lower (the broker's refusal is classified the same way).
	MaxMessageBytes int
	// Declare, for a quick start, makes Declare create the exchange when
	// it is missing (durable, of ExchangeType) and the quorum queue Queue
	// bound to it with the binding key "#" when that is missing. Existing
	// ones are never changed. Default false.
	Declare bool
	// ExchangeType is the type of an exchange Declare creates. Default
	// "topic".
	ExchangeType string
	// Queue is the quorum queue Declare creates. Default: the exchange's
	// name.
	Queue string
}

// Options tunes a Sink. The zero value uses the defaults documented on
// each field.
type Options struct {
	// Channels is how many channels the sink publishes over; the events
	// of one exchange share one. Default 4.
	Channels int
	// ConfirmTimeout bounds the wait for a confirm, counted from the last
	// send of a Publish call. When it passes the sink drops the connection
	// (see the package documentation). Default 30s.
	ConfirmTimeout time.Duration
	// MaxPerAggregate is the most events of one ordering key a Publish
	// call takes (sink.Ordered); each costs the call one confirm round
	// trip. Values below 2 turn it off. Default 32.
	MaxPerAggregate int
	// DialTimeout bounds connecting and the AMQP handshake. Default 10s.
	DialTimeout time.Duration
	// Logger receives connection events. Default slog.Default().
	Logger *slog.Logger
	// Envelope, when set, adds the CloudEvents attributes to every
	// message as cloudEvents: headers (the AMQP binding). Default nil.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward. Default: counters of the sink's own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	if o.Channels <= 0 {
		o.Channels = 4
	}
	if o.ConfirmTimeout <= 0 {
		o.ConfirmTimeout = 30 * time.Second
	}
	if o.MaxPerAggregate == 0 {
		o.MaxPerAggregate = 32
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

// Sink publishes events to RabbitMQ. It implements sink.Sink, sink.Ordered
// and sink.Destinations; its methods are safe for concurrent use.
type Sink struct {
	cfg      Config
	opts     Options
	uri      amqp.URI
	tls      *tls.Config
	exchange template.Template
	key      template.Template
	rows     *sink.HeaderFilter
	maxBody  int

	dialMu sync.Mutex // serializes dialling
	mu     sync.Mutex
	conn   *conn // nil until dialled, and after it is lost

	closeOnce sync.Once
	closed    chan struct{}
}

// New returns a sink for cfg. It checks the URL, templates and TLS files
// but does not connect: the first Publish, Probe or Check does.
func New(cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	uri, err := amqp.ParseURI(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink.rabbitmq.url: %w", redact.Error(err))
	}
	exchange, err := template.Parse(cfg.Exchange, sanitizeExchange)
	if err != nil {
		return nil, fmt.Errorf("sink.rabbitmq.exchange: %w", err)
	}
	if err := checkExchangeTemplate(cfg.Exchange); err != nil {
		return nil, fmt.Errorf("sink.rabbitmq.exchange: %w", err)
	}
	key, err := template.Parse(cfg.RoutingKey, sanitizeKey)
	if err != nil {
		return nil, fmt.Errorf("sink.rabbitmq.routing_key: %w", err)
	}
	tc, err := tlsconf.Config("sink.rabbitmq.tls", cfg.TLS)
	if err != nil {
		return nil, err
	}
	if tc == nil && uri.Scheme == "amqps" {
		tc = &tls.Config{}
	}
	if tc != nil && tc.ServerName == "" {
		tc = tc.Clone()
		tc.ServerName = uri.Host
	}
	s := &Sink{
		cfg: cfg, opts: opts, uri: uri, tls: tc,
		exchange: exchange.Limit(maxExchange),
		key:      key.Limit(maxShortStr),
		rows:     sink.NewHeaderFilter(sink.RabbitMQRules, envelope.AMQP.ReservedPrefix(opts.Envelope), opts.HeaderDrops),
		maxBody:  cfg.MaxMessageBytes,
		closed:   make(chan struct{}),
	}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxMessageBytes
	}
	return s, nil
}

// checkExchangeTemplate checks that the literal text of tmpl holds only
// runes sanitizeExchange keeps and fits an exchange name.
func checkExchangeTemplate(tmpl string) error {
	literal := tmpl
	for _, p := range template.Placeholders {
		literal = strings.ReplaceAll(literal, p, "")
	}
	if strings.Map(sanitizeExchange, literal) != literal {
		return fmt.Errorf("template %q: an exchange name holds only letters, digits, '-', '_', '.' and ':'", tmpl)
	}
	if len(literal) > maxExchange {
		return fmt.Errorf("template %q: an exchange name has at most %d bytes", tmpl, maxExchange)
	}
	if strings.HasPrefix(tmpl, "amq.") && literal != tmpl {
		return fmt.Errorf("template %q: RabbitMQ reserves the names starting with amq.", tmpl)
	}
	return nil
}

// sanitizeExchange maps a rune the AMQP specification does not allow in an
// exchange name to '_'.
func sanitizeExchange(r rune) rune {
	if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':' {
		return r
	}
	return '_'
}

// sanitizeKey maps '.', the word separator of topic routing keys, and
// control characters to '_'.
func sanitizeKey(r rune) rune {
	if r == '.' || r < 0x20 || r == 0x7f {
		return '_'
	}
	return r
}

// Destination describes where the sink publishes, for logs and relay
// check, without credentials.
func (s *Sink) Destination() string {
	return fmt.Sprintf("rabbitmq %s exchange %q routing key %q", redact.String(s.safeURL()), s.cfg.Exchange, s.cfg.RoutingKey)
}

// safeURL returns the broker's URL without the password.
func (s *Sink) safeURL() string {
	u := s.uri
	u.Password = ""
	return u.String()
}

// errClosed fails the publishes of a closed sink.
var errClosed = errors.New("rabbitmq sink closed")

// Close closes the connection; in-flight publishes fail as unavailable.
// It is idempotent and returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.mu.Lock()
		c := s.conn
		s.conn = nil
		s.mu.Unlock()
		if c != nil {
			c.close(errClosed)
		}
	})
	return nil
}

// connection returns the live connection, dialling one when there is
// none.
func (s *Sink) connection(ctx context.Context) (*conn, error) {
	if c := s.live(); c != nil {
		return c, nil
	}
	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	if c := s.live(); c != nil {
		return c, nil
	}
	select {
	case <-s.closed:
		return nil, fault.AsUnavailable(errClosed)
	default:
	}
	c, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	s.opts.Logger.Info("rabbitmq connected", "url", s.safeURL())
	go func() {
		<-c.dead
		if !errors.Is(c.err, errClosed) {
			s.opts.Logger.Warn("rabbitmq connection lost", "url", s.safeURL(), "err", redact.Error(c.err))
		}
	}()
	return c, nil
}

// live returns the current connection while it is open.
func (s *Sink) live() *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.isDead() {
		return s.conn
	}
	s.conn = nil
	return nil
}

// dial connects and opens the connection, within DialTimeout and ctx.
func (s *Sink) dial(ctx context.Context) (*conn, error) {
	timeout := s.opts.DialTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(timeout, time.Until(dl)), time.Millisecond)
	}
	c := &conn{s: s, dead: make(chan struct{}), chans: make([]*pubChan, s.opts.Channels)}
	cfg := amqp.Config{
		Heartbeat:       10 * time.Second,
		TLSClientConfig: s.tls,
		Properties:      amqp.Table{"connection_name": "outbox-relay"},
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			raw, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			raw.SetDeadline(time.Now().Add(timeout)) // the handshake; amqp091 clears it
			c.raw = &deadlineConn{Conn: raw, write: s.opts.ConfirmTimeout}
			return c.raw, nil
		},
	}
	url := s.cfg.URL
	if s.tls != nil && s.uri.Scheme == "amqp" {
		// sink.rabbitmq.tls on an amqp:// URL: the client encrypts only
		// amqps:// connections. The port stays the URL's.
		u := s.uri
		u.Scheme = "amqps"
		url = u.String()
	}
	ac, err := amqp.DialConfig(url, cfg)
	if err != nil {
		// Refused credentials or virtual host, TLS and network failures
		// alike are the broker's, to be fixed there while the relay waits.
		return nil, fault.AsUnavailable(fmt.Errorf("connect to rabbitmq %s: %w", s.safeURL(), redact.Error(err)))
	}
	c.ac = ac
	c.frameMax = ac.Config.FrameSize
	closes := ac.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		err, ok := <-closes
		if !ok || err == nil {
			c.close(amqp.ErrClosed)
			return
		}
		c.close(err)
	}()
	return c, nil
}

// deadlineConn bounds each write, so that a broker that stops reading
// cannot block a publish for ever: the write fails and the connection with
// it.
type deadlineConn struct {
	net.Conn
	write time.Duration
}

func (d *deadlineConn) Write(p []byte) (int, error) {
	d.Conn.SetWriteDeadline(time.Now().Add(d.write))
	return d.Conn.Write(p)
}

// abort closes the TCP connection at once with a reset, so that nothing
// the sink wrote and the kernel did not send yet reaches the broker later.
func (d *deadlineConn) abort() {
	if tc, ok := d.Conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	d.Conn.Close()
}

// channelFor returns the slot of the channel that carries exchange's
// events.
func (s *Sink) channelFor(exchange string) int {
	h := fnv.New32a()
	h.Write([]byte(exchange))
	return int(h.Sum32() % uint32(s.opts.Channels))
}

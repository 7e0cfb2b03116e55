// Package webhook delivers events as HTTP POST requests.
//
// Each event becomes one request to the URL rendered from the URL template,
// with the payload as body and the headers Idempotency-Key and message_id
// set to the event ID, so a receiver can drop a redelivery. A 2xx response
// acknowledges the event. See docs/webhook.md for the request format and for
// how a receiver verifies the optional signature.
package webhook

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	whsig "github.com/outboxrelay/relay/helpers/webhook"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Defaults applied by New to zero config values.
const (
	// DefaultTimeout bounds one request when sink.webhook.timeout is zero.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxConcurrency is the number of requests in flight at once
	// when sink.webhook.max_concurrency is zero.
	DefaultMaxConcurrency = 64
	// MaxRetryAfter caps how long the sink holds the requests to a URL after
	// its receiver answered 429 or 503 with a Retry-After header.
	MaxRetryAfter = 5 * time.Minute
)

const (
	userAgent       = "outbox-relay"
	dialTimeout     = 10 * time.Second
	idleConnTimeout = 90 * time.Second
)

// Config says where and how a Sink sends requests. The relay fills it from
// the sink.webhook keys of its configuration file.
type Config struct {
	// URL is the URL template events are POSTed to: an absolute http or
	// https URL whose path and query may hold placeholders, which are
	// URL-escaped. Required.
	URL string
	// Timeout bounds one request: connecting, sending it and reading the
	// response. Default DefaultTimeout.
	Timeout time.Duration
	// Secret, when set, signs every request as Standard Webhooks does
	// (webhook-id, webhook-timestamp, webhook-signature): "whsec_<base64>"
	// or raw, at least 16 bytes, as the helpers' webhook.ParseSecret reads
	// it. Default empty: requests are not signed.
	Secret string
	// Secrets are more secrets, read as Secret is: each request carries
	// one v1 signature per secret, Secret's first, space-separated, as
	// Standard Webhooks does while a secret is rotated. Default none.
	Secrets []string
	// Headers are added to every request, such as Authorization. They
	// override the row's headers and cannot set a header CheckStaticHeader
	// refuses. Default none.
	Headers map[string]string
	// MaxConcurrency caps the requests in flight at once. Default
	// DefaultMaxConcurrency.
	MaxConcurrency int
	// HealthURL, when set, is an absolute http or https URL without
	// placeholders that Probe GETs, with the static headers; a 2xx answer
	// means ready. Default empty: Probe has nothing to check.
	HealthURL string
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// Logger receives the sink's own logs: a receiver asking to slow down.
	// Default slog.Default().
	Logger *slog.Logger
	// Transport sends the requests. Default: a keep-alive transport that
	// opens and keeps up to max_concurrency connections per host, honours
	// HTTPS_PROXY, HTTP_PROXY and NO_PROXY, and attempts HTTP/2 over TLS.
	// Tests use it to count or fail connections.
	Transport http.RoundTripper
	// Envelope, when set, adds the CloudEvents attributes to every request
	// as Ce- headers (binary content mode). Default nil: no envelope.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward (see sink.HeaderFilter). Default: counters of the sink's
	// own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

// Sink POSTs events to a webhook receiver. It implements sink.Sink; its
// methods are safe for concurrent use.
type Sink struct {
	log     *slog.Logger
	url     *urlTemplate
	timeout time.Duration
	headers http.Header           // static headers from sink.webhook.headers
	rows    *sink.HeaderFilter    // which row headers are sent
	secrets [][]byte              // none: requests are not signed
	env     *envelope.CloudEvents // nil: no envelope
	health  string                // sink.webhook.health_url; empty: none
	client  *http.Client
	proxy   func(*http.Request) (*url.URL, error) // nil when Options.Transport was given

	// sem holds a token per request in flight, across all Publish calls.
	sem  chan struct{}
	gate gate

	closeOnce sync.Once
	closed    context.Context // done once Close was called
	close     context.CancelFunc
}

var (
	_ sink.Sink         = (*Sink)(nil)
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

// New returns a sink that POSTs to URLs rendered from cfg.URL. It fails on a
// URL template that is not an absolute http or https URL, that has a
// placeholder in its scheme, user information, host or port (event data
// never chooses the server), or a fragment, and on a static header that is
// not a valid HTTP header or collides with a header the sink sets, and on a
// secret that is not at least 16 bytes or bad base64 after whsec_. New does
// no I/O; Check verifies the receiver is reachable.
//
// A zero cfg.Timeout means DefaultTimeout and a zero cfg.MaxConcurrency
// means DefaultMaxConcurrency. Requests of all concurrent Publish calls
// share one connection pool and at most cfg.MaxConcurrency of them are in
// flight at once.
func New(cfg Config, opts Options) (*Sink, error) {
	tmpl, err := parseURLTemplate(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink.webhook.url: %w", err)
	}
	headers := make(http.Header, len(cfg.Headers))
	for k, v := range cfg.Headers {
		if err := CheckStaticHeader(k, v); err != nil {
			return nil, fmt.Errorf("sink.webhook.headers.%s: %w", k, err)
		}
		headers.Set(k, v)
	}
	if cfg.MaxConcurrency < 0 {
		return nil, fmt.Errorf("sink.webhook.max_concurrency: must not be negative, got %d", cfg.MaxConcurrency)
	}
	n := cfg.MaxConcurrency
	if n == 0 {
		n = DefaultMaxConcurrency
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	drops := opts.HeaderDrops
	if drops == nil {
		drops = sink.NewHeaderDrops(log)
	}
	s := &Sink{
		log:     log,
		url:     tmpl,
		timeout: timeout,
		headers: headers,
		rows:    sink.NewHeaderFilter(sink.HTTPRules, envelope.HTTP.ReservedPrefix(opts.Envelope), drops),
		sem:     make(chan struct{}, n),
		health:  cfg.HealthURL,
		env:     opts.Envelope,
	}
	if s.secrets, err = parseSecrets(cfg, log); err != nil {
		return nil, err
	}
	rt := opts.Transport
	if rt == nil {
		s.proxy = http.ProxyFromEnvironment
		rt = newTransport(n, s.proxy)
	}
	s.client = &http.Client{
		Transport: rt,
		// Redirects are not followed: Go would turn a 301, 302 or 303 into
		// a GET without the body, and a signed request must not be replayed
		// to wherever a Location points. A 3xx fails as permanent.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	s.closed, s.close = context.WithCancel(context.Background())
	return s, nil
}

// parseSecrets returns the keys of cfg's secrets, Secret's first, and logs
// whsig.SecretAdvice's warning about any of them.
func parseSecrets(cfg Config, log *slog.Logger) ([][]byte, error) {
	type named struct{ key, secret string }
	var secrets []named
	if cfg.Secret != "" {
		secrets = append(secrets, named{"sink.webhook.secret", cfg.Secret})
	}
	for i, secret := range cfg.Secrets {
		secrets = append(secrets, named{fmt.Sprintf("sink.webhook.secrets[%d]", i), secret})
	}
	keys := make([][]byte, 0, len(secrets))
	for _, n := range secrets {
		key, err := whsig.ParseSecret(n.secret)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.key, err)
		}
		if advice := whsig.SecretAdvice(n.secret); advice != "" {
			log.Warn(n.key+": "+advice, "key", n.key)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

// newTransport returns a keep-alive transport that opens at most n
// connections per host and keeps them idle for reuse. A request whose slot
// was freed before the previous response's connection went back to the
// pool waits for that connection instead of opening another.
func newTransport(n int, proxy func(*http.Request) (*url.URL, error)) *http.Transport {
	return &http.Transport{
		Proxy:                 proxy,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          n,
		MaxIdleConnsPerHost:   n,
		MaxConnsPerHost:       n,
		IdleConnTimeout:       idleConnTimeout,
		TLSHandshakeTimeout:   dialTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// Close fails the requests in flight and those waiting for a slot with an
// error classified fault.Unavailable, and closes idle connections. Close is
// idempotent and always returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.close()
		s.client.CloseIdleConnections()
	})
	return nil
}

// urlTemplate is a URL template whose placeholders are escaped for the part
// of the URL they are in: path segments with url.PathEscape, so a "/" in an
// aggregate ID stays inside its segment, and the query with url.QueryEscape.
// template.Template cannot do this: its sanitizer maps a rune to one rune, while
// escaping turns one rune into several bytes.
type urlTemplate struct {
	raw    string
	prefix string   // the fixed scheme://[userinfo@]host[:port], as written
	base   *url.URL // prefix parsed
	parts  []urlPart
}

// urlPart is literal text or a placeholder.
type urlPart struct {
	text        string // literal text, or the placeholder with its braces
	placeholder bool
	query       bool // in the query: query escaping
}

func parseURLTemplate(raw string) (*urlTemplate, error) {
	if raw == "" {
		return nil, fmt.Errorf("required")
	}
	if _, err := template.Parse(raw, nil); err != nil {
		return nil, redact.Error(err)
	}
	if err := destname.WebhookURL(raw); err != nil {
		return nil, fmt.Errorf("%q: %w", redact.String(raw), err)
	}
	_, rest, _ := strings.Cut(raw, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority := raw[:len(raw)-len(rest)+end]
	base, err := url.Parse(authority)
	if err != nil {
		return nil, redact.Error(err)
	}

	t := &urlTemplate{raw: raw, prefix: authority, base: base}
	path, inQuery := rest[end:], false
	for path != "" {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			t.parts = append(t.parts, urlPart{text: path})
			break
		}
		j := strings.IndexByte(path[i:], '}') + i
		if i > 0 {
			t.parts = append(t.parts, urlPart{text: path[:i]})
			inQuery = inQuery || strings.Contains(path[:i], "?")
		}
		t.parts = append(t.parts, urlPart{text: path[i : j+1], placeholder: true, query: inQuery})
		path = path[j+1:]
	}
	return t, nil
}

// render returns the URL of an event with the given values of
// {aggregate_type}, {event_type} and {aggregate_id}.
func (t *urlTemplate) render(values map[string]string) string {
	var b strings.Builder
	b.Grow(len(t.raw) + 32)
	b.WriteString(t.prefix)
	for _, p := range t.parts {
		if !p.placeholder {
			b.WriteString(p.text)
			continue
		}
		b.WriteString(escapeValue(values[p.text], p.query))
	}
	return b.String()
}

// escapeValue escapes a placeholder's value. An empty value renders as
// template.Hash(""), like template.Template does, and the path segments "." and ".." are escaped so
// a server that cleans paths does not resolve them.
func escapeValue(v string, query bool) string {
	switch {
	case v == "":
		return template.Hash("")
	case query:
		return url.QueryEscape(v)
	case v == ".":
		return "%2E"
	case v == "..":
		return "%2E%2E"
	}
	return url.PathEscape(v)
}

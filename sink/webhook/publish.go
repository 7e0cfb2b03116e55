package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	whsig "github.com/outboxrelay/relay/helpers/webhook"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// Header names the sink sets on every request. The contract's names with an
// underscore are sent exactly as written here (lower case), not in Go's
// canonical form; HTTP header names are case-insensitive.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderMessageID      = "message_id"
	HeaderEventType      = "event_type"
	HeaderAggregateType  = "aggregate_type"
	HeaderAggregateID    = "aggregate_id"
	// The Standard Webhooks signature headers, sent in lower case as
	// written when sink.webhook.secret is set.
	HeaderWebhookID        = whsig.HeaderID
	HeaderWebhookTimestamp = whsig.HeaderTimestamp
	HeaderSignature        = whsig.HeaderSignature
)

const (
	// maxErrorBody is how much of a failed response's body goes into the
	// error message.
	maxErrorBody = 256
	// maxDrain is how much of a response body is read so the connection
	// can be reused; a longer body closes the connection instead.
	maxDrain = 64 << 10
)

// Publish POSTs every event of batch, up to max_concurrency requests at
// once across all Publish calls, and returns when every request finished.
// It returns nil when all were acknowledged with a 2xx status and a
// *sink.BatchError otherwise. Control characters in header values (row
// headers, event_type, aggregate_type, aggregate_id) are sent as spaces.
//
// Failures are classified by scope. The receiver is at fault, whatever the
// event, for connection, DNS and TLS failures, the per-request timeout,
// ctx ending, Close, a redirect (3xx, not followed: the URL is wrong),
// 401, 403, 404, 405, 407, 408, 410 and 429, and every 5xx but 500: these
// are fault.Unavailable, never counted as attempts. 400, 413, 414, 422
// and 431 are fault.Permanent and 500 and the other 4xx transient, all
// marked fault.AsSuspect: they count against the event only while other
// events to the same URL succeed. A URL over destname.MaxWebhookURL bytes,
// a row header whose name HTTP cannot carry, and with an envelope an event
// that cannot be a CloudEvent, are permanent. Row headers the sink.HTTPRules
// filter drops (the relay's header names, hop-by-hop and framing headers)
// are not sent. After a 429 or 503 with a Retry-After header the sink sends
// no request to that URL until that time has passed (at most
// MaxRetryAfter): they fail at once as fault.Unavailable, while other URLs
// go on. The error's RetryAfter method returns the delay. Publish is safe for
// concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, e := range batch {
		if err := s.acquire(ctx); err != nil {
			errs[i] = s.wrap(e, s.target(e), err)
			continue
		}
		wg.Go(func() {
			defer s.release()
			errs[i] = s.post(ctx, e)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return &sink.BatchError{Errs: errs}
		}
	}
	return nil
}

// errClosed fails publishes on a closed sink.
var errClosed = errors.New("webhook sink closed")

// acquire takes a request slot, waiting while max_concurrency requests are
// in flight.
func (s *Sink) acquire(ctx context.Context) error {
	if s.closed.Err() != nil {
		return fault.AsUnavailable(errClosed)
	}
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fault.AsUnavailable(ctx.Err())
	case <-s.closed.Done():
		return fault.AsUnavailable(errClosed)
	}
}

func (s *Sink) release() { <-s.sem }

// post sends one event and returns its classified error.
func (s *Sink) post(ctx context.Context, e *event.Event) error {
	target := s.target(e)
	if len(target) > destname.MaxWebhookURL {
		return s.wrap(e, "an invalid URL", fault.AsPermanent(fmt.Errorf("the URL is %d bytes, over the %d the relay sends (servers refuse longer request lines)", len(target), destname.MaxWebhookURL)))
	}
	h, err := s.header(e)
	if err != nil {
		return s.wrap(e, target, fault.AsPermanent(err))
	}
	if err := s.gate.check(target, time.Now()); err != nil {
		return s.wrap(e, target, err)
	}

	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	stop := context.AfterFunc(s.closed, cancel)
	defer stop()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, target, bytes.NewReader(e.Payload))
	if err != nil {
		return s.wrap(e, target, fault.AsPermanent(redact.Error(err)))
	}
	req.Header = h
	if len(s.secrets) > 0 {
		s.sign(req.Header, e, time.Now())
	}

	resp, err := s.client.Do(req)
	if err != nil {
		return s.wrap(e, target, s.transportError(ctx, reqCtx, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	serr := &StatusError{
		StatusCode: resp.StatusCode,
		Status:     resp.Status,
		Body:       printable(snippet),
		Location:   redact.String(resp.Header.Get("Location")),
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && d > 0 {
			serr.Delay = min(d, MaxRetryAfter)
			if s.gate.hold(target, time.Now().Add(serr.Delay)) {
				s.log.Warn("webhook receiver asked to slow down; holding the requests to its URL",
					"status", resp.StatusCode, "retry_after", serr.Delay, "url", redact.String(target))
			}
		}
	}
	return s.wrap(e, target, classifyStatus(serr))
}

// target returns the URL of e.
func (s *Sink) target(e *event.Event) string {
	return s.url.render(map[string]string{
		"{aggregate_type}": e.AggregateType,
		"{event_type}":     e.EventType,
		"{aggregate_id}":   e.AggregateID,
	})
}

// wrap adds the event and URL to err, keeping its class.
func (s *Sink) wrap(e *event.Event, target string, err error) error {
	switch fault.ClassOf(err) {
	case fault.Permanent:
		return fault.AsPermanent(fmt.Errorf("POST %s for event %s: %w", redact.String(target), e.ID, err))
	case fault.Unavailable:
		return fault.AsUnavailable(fmt.Errorf("POST %s for event %s: %w", redact.String(target), e.ID, err))
	}
	return fmt.Errorf("POST %s for event %s: %w", redact.String(target), e.ID, err)
}

// The bounds on a row's headers in one request; an event over either
// fails as its own fault (permanent) and is dead-lettered. 64 KiB is
// JetStream's limit on a message's headers too.
const (
	MaxRowHeaders     = 256
	MaxRowHeaderBytes = 64 << 10
)

// header returns the request headers of e: its Headers map (names in
// canonical form), then the static headers, then the contract headers, each
// overriding the ones before it, and with an envelope the CloudEvents
// headers in place of any other Ce- header. Row headers s.rows drops are
// left out.
func (s *Sink) header(e *event.Event) (http.Header, error) {
	if len(e.Headers) > MaxRowHeaders {
		return nil, fmt.Errorf("the row has %d headers, over the %d the relay sends in a request", len(e.Headers), MaxRowHeaders)
	}
	h := make(http.Header, len(e.Headers)+len(s.headers)+8)
	size := 0
	for k, v := range e.Headers {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if !s.rows.Forward(k) || s.headers[ck] != nil {
			continue
		}
		if !validHeaderName(k) {
			return nil, fmt.Errorf("row header %q is not a valid HTTP header name", k)
		}
		if size += len(k) + len(v) + len(": \r\n"); size > MaxRowHeaderBytes {
			return nil, fmt.Errorf("the row's headers are over %d bytes, more than the relay sends in a request (servers refuse large header blocks)", MaxRowHeaderBytes)
		}
		h[ck] = append(h[ck], headerValue(v))
	}
	for k, v := range s.headers {
		h[k] = v
	}
	if h["User-Agent"] == nil {
		h.Set("User-Agent", userAgent)
	}
	contentType := e.ContentType
	if contentType == "" {
		contentType = event.ContentTypeBinary
	}
	h.Set("Content-Type", contentType)
	h.Set(HeaderIdempotencyKey, e.ID) // canonical key: net/http retries requests with it
	h[HeaderMessageID] = []string{headerValue(e.ID)}
	h[HeaderEventType] = []string{headerValue(e.EventType)}
	h[HeaderAggregateType] = []string{headerValue(e.AggregateType)}
	h[HeaderAggregateID] = []string{headerValue(e.AggregateID)}
	if s.env != nil {
		return h, cloudEvent(h, e, s.env)
	}
	return h, nil
}

// cloudEvent replaces the headers of h in the Ce- namespace, from the row
// or sink.webhook.headers, with e's CloudEvents attributes; Content-Type is
// already its datacontenttype.
func cloudEvent(h http.Header, e *event.Event, env *envelope.CloudEvents) error {
	if err := env.Check(e); err != nil {
		return err
	}
	for k := range h {
		if envelope.HTTP.Owns(k) {
			delete(h, k)
		}
	}
	env.Binary(e, envelope.HTTP, func(k, v string) { h[textproto.CanonicalMIMEHeaderKey(k)] = []string{v} })
	return nil
}

// headerValue returns v with each control character other than horizontal
// tab (CR and LF in particular, which could inject headers) replaced by a
// space: HTTP header values cannot carry them. Receivers also trim leading
// and trailing spaces. The URL and the body carry values unchanged.
func headerValue(v string) string {
	if validHeaderValue(v) {
		return v
	}
	return strings.Map(func(r rune) rune {
		if (r < ' ' && r != '\t') || r == 0x7f {
			return ' '
		}
		return r
	}, v)
}

// staticRules is the filter of sink.webhook.headers: a static header may
// not be one the relay never forwards from a row (sink.RelayHeaders and
// sink.HTTPRules), except User-Agent, which it may set.
var staticRules = sink.NewHeaderFilter(sink.HTTPRules, "", nil)

// CheckStaticHeader returns why sink.webhook.headers cannot hold the entry
// name: value, or nil when it can. The error repeats neither the value nor
// the name other than in canonical form.
func CheckStaticHeader(name, value string) error {
	switch {
	case !validHeaderName(name):
		return errors.New("not a valid HTTP header name")
	case !strings.EqualFold(name, "User-Agent") && staticRules.Reason(name) != "":
		return fmt.Errorf("%s is set by the relay or by HTTP itself and cannot be configured", textproto.CanonicalMIMEHeaderKey(name))
	case !validHeaderValue(value):
		return errors.New("the value has a control character")
	}
	return nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v has no control character other than
// horizontal tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// sign sets the Standard Webhooks headers of e sent at now: its id, the
// time in unix seconds and the signature of both with the body.
func (s *Sink) sign(h http.Header, e *event.Event, now time.Time) {
	ts := now.Unix()
	h[HeaderWebhookID] = []string{e.ID}
	h[HeaderWebhookTimestamp] = []string{strconv.FormatInt(ts, 10)}
	sigs := make([]string, len(s.secrets))
	for i, key := range s.secrets {
		sigs[i] = whsig.Sign(key, e.ID, ts, e.Payload)
	}
	h[HeaderSignature] = []string{strings.Join(sigs, " ")}
}

// StatusError is a response whose status is not 2xx.
type StatusError struct {
	// StatusCode and Status are the response's, e.g. 503 and
	// "503 Service Unavailable".
	StatusCode int
	Status     string
	// Body is the start of the response body, with control characters
	// replaced.
	Body string
	// Location is the redirect target of a 3xx response, credentials
	// masked.
	Location string
	// Delay is the wait a 429 or 503 response asked for with Retry-After,
	// at most MaxRetryAfter; 0 when it asked for none.
	Delay time.Duration
}

// Error describes the response.
func (e *StatusError) Error() string {
	var b strings.Builder
	b.WriteString(e.Status)
	if e.StatusCode >= 300 && e.StatusCode < 400 {
		fmt.Fprintf(&b, " (redirect to %q not followed; set sink.webhook.url to the final URL)", e.Location)
	}
	if e.Delay > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.Delay)
	}
	if e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	return b.String()
}

// RetryAfter returns the delay the receiver asked for before the next
// attempt, or 0. The pipeline may find it with errors.As and an interface
// { RetryAfter() time.Duration }.
func (e *StatusError) RetryAfter() time.Duration { return e.Delay }

// classifyStatus marks a non-2xx response with its fault.Class and scope
// (see Publish).
func classifyStatus(e *StatusError) error {
	switch c := e.StatusCode; {
	case c == http.StatusBadRequest, c == http.StatusRequestEntityTooLarge, c == http.StatusRequestURITooLong,
		c == http.StatusUnprocessableEntity, c == http.StatusRequestHeaderFieldsTooLarge:
		return fault.AsSuspect(fault.AsPermanent(e))
	case c >= 300 && c < 400, receiverDown[c], c > 500:
		return fault.AsUnavailable(e)
	case c >= 400:
		return fault.AsSuspect(e)
	}
	return e // 1xx that net/http did not handle
}

// receiverDown are the 4xx statuses that say the receiver, not the event,
// is at fault: credentials, permissions, a missing route, rate limits.
var receiverDown = map[int]bool{
	http.StatusUnauthorized: true, http.StatusForbidden: true, http.StatusNotFound: true,
	http.StatusMethodNotAllowed: true, http.StatusProxyAuthRequired: true,
	http.StatusRequestTimeout: true, http.StatusGone: true, http.StatusTooManyRequests: true,
}

// transportError classifies a failed round trip. Every failure to reach the
// receiver or to get its answer in time is fault.Unavailable.
func (s *Sink) transportError(ctx, reqCtx context.Context, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the URL, which wrap adds redacted
	}
	err = redact.Error(err)
	switch {
	case s.closed.Err() != nil:
		return fault.AsUnavailable(errClosed)
	case ctx.Err() != nil:
		return fault.AsUnavailable(err)
	case errors.Is(reqCtx.Err(), context.DeadlineExceeded):
		return fault.AsUnavailable(fmt.Errorf("no response within %s (sink.webhook.timeout): %w", s.timeout, context.DeadlineExceeded))
	}
	return fault.AsUnavailable(err)
}

// parseRetryAfter reads a Retry-After value: delay seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now).Round(time.Millisecond), 0), true
}

// gate pauses the URLs whose receiver asked for a pause with Retry-After:
// a request to a paused URL fails at once, without being sent, while the
// other URLs go on. It remembers at most maxPaused URLs; beyond that a new
// pause is not recorded (the pipeline still holds the URL's events after
// the 429 or 503). Safe for concurrent use.
type gate struct {
	mu     sync.Mutex
	paused map[string]time.Time // URL -> the end of its pause
}

// maxPaused bounds the URLs the gate remembers at once.
const maxPaused = 4096

// hold pauses url until t, unless it already is paused longer. It reports
// whether requests to url were flowing before, so the caller logs a pause
// once.
func (g *gate) hold(url string, t time.Time) bool {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.paused[url]
	flowing := !ok || !now.Before(until)
	if !ok && len(g.paused) >= maxPaused {
		maps.DeleteFunc(g.paused, func(_ string, u time.Time) bool { return !now.Before(u) })
		if len(g.paused) >= maxPaused {
			return flowing
		}
	}
	if g.paused == nil {
		g.paused = make(map[string]time.Time)
	}
	if t.After(until) {
		g.paused[url] = t
	}
	return flowing
}

// check returns nil when requests to url may be sent at now, and an error
// classified fault.Unavailable while url is paused.
func (g *gate) check(url string, now time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.paused[url]
	if !ok {
		return nil
	}
	if !now.Before(until) {
		delete(g.paused, url)
		return nil
	}
	return fault.AsUnavailable(fmt.Errorf("the receiver asked for a pause (Retry-After) until %s; not sent",
		until.UTC().Format(time.RFC3339)))
}

// printable returns b as text with control characters and invalid UTF-8
// replaced, trimmed of surrounding space.
func printable(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

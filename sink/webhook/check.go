package webhook

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/sink"
)

// Check verifies that the receiver's host (or the proxy's, when one is
// configured in the environment for the URL) resolves and accepts a TCP
// connection, within sink.webhook.timeout. It sends no request, so it has
// no effect on the receiver. The URL's fixed part, scheme and host, is all
// it needs: placeholders may only occur in the path and query. Its errors
// say what to change.
func (s *Sink) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	u := s.url.base
	what, fix := "webhook receiver", "check sink.webhook.url"
	if s.proxy != nil {
		if p, err := s.proxy(&http.Request{URL: u}); err != nil {
			return fmt.Errorf("proxy for %s: %w; check HTTPS_PROXY / HTTP_PROXY", redact.String(u.String()), redact.Error(err))
		} else if p != nil {
			u, what, fix = p, "proxy", "check HTTPS_PROXY / HTTP_PROXY / NO_PROXY"
		}
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	if net.ParseIP(host) == nil {
		if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
			return fmt.Errorf("%s host %s does not resolve: %w; %s and DNS", what, host, err, fix)
		}
	}
	addr := net.JoinHostPort(host, port)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%s %s: cannot connect: %w; %s, that the receiver runs and that no firewall blocks it", what, addr, err, fix)
	}
	conn.Close()
	return nil
}

// URL returns sink.webhook.url with credentials masked, for logs and
// `relay check` output.
func (s *Sink) URL() string { return redact.String(s.url.raw) }

// DestinationOf returns the URL e is POSTed to, credentials masked.
func (s *Sink) DestinationOf(e *event.Event) string { return redact.String(s.target(e)) }

// RowChosen implements sink.RowRouted: true when the URL template has a
// placeholder.
func (s *Sink) RowChosen() bool {
	return slices.ContainsFunc(s.url.parts, func(p urlPart) bool { return p.placeholder })
}

// Probe checks the receiver while no events flow: for sink.Broker, with
// sink.webhook.health_url set, it GETs that URL with the static headers and
// wants a 2xx answer within sink.webhook.timeout. Any other destination,
// or no health_url, gives sink.ErrNoProbe: a receiver's URL is only ever
// POSTed events.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	if dest != sink.Broker || s.health == "" {
		return sink.ErrNoProbe
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.health, nil)
	if err != nil {
		return fmt.Errorf("sink.webhook.health_url: %w", redact.Error(err))
	}
	req.Header = s.headers.Clone()
	req.Header.Set("User-Agent", userAgent)
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", redact.String(s.health), s.transportError(ctx, ctx, err))
	}
	defer resp.Body.Close()
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fault.AsUnavailable(fmt.Errorf("GET %s: %s", redact.String(s.health), resp.Status))
	}
	return nil
}

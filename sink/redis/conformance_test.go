package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// confMaxBulk is the server's proto-max-bulk-len in the conformance run,
// the least Redis takes: it keeps the oversize check cheap.
const confMaxBulk = 1 << 20

// TestConformance runs the shared sink conformance suite against a
// redis-server with an append-only file, so that its entries survive the
// restart check.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Args: []string{"--proto-max-bulk-len", "1mb"}})
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink {
			return newTestSink(t, Config{URL: srv.URL(), Stream: tmpl}, Options{})
		},
		Received: func(t *testing.T, scope string) []sinktest.Message {
			return readStreams(t, srv.URL(), scope+"*")
		},
		Sanitize: sanitize,
		Restart: func(t *testing.T) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		},
		Stop: func(t *testing.T) { srv.Stop() },
		Start: func(t *testing.T) {
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
		},
		// A TCP proxy that stops moving bytes: the XADDs are sent and
		// never answered, and the sink's own timeout is a minute away.
		NewStalled: func(t *testing.T, scope, tmpl string) sink.Sink {
			p, err := testenv.StartProxy(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			s := newTestSink(t, Config{URL: "redis://" + p.Addr() + "/0", Stream: tmpl}, Options{Timeout: time.Minute})
			s.maxBulk.Store(confMaxBulk) // the CONFIG GET would stall too
			p.Stall()
			return s
		},
		MaxMessageBytes: confMaxBulk,
		Inspect: func(t *testing.T, e *event.Event, m sinktest.Message) {
			fields := m.Raw.([]string)
			if fields[len(fields)-2] != fieldPayload {
				t.Errorf("event %s: last field %q, want payload", e.ID, fields[len(fields)-2])
			}
		},
		Features: sinktest.Features{
			ContentTypeHeader: fieldContentType,
			Control:           sink.RedisRules,
		},
	})
}

// newTestSink returns a sink that the test closes when it ends.
func newTestSink(t *testing.T, cfg Config, opts Options) *Sink {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// readStreams returns every entry of the streams whose names match
// pattern, each stream in order, over a client of its own: the payload
// field as the payload, every other field as a header, the field-value
// pairs as they are stored as Raw.
func readStreams(t *testing.T, url, pattern string) []sinktest.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newClient(t, url)
	defer c.Close()
	var all []string
	iter := c.ScanType(ctx, 0, pattern, 1000, "stream").Iterator()
	for iter.Next(ctx) {
		all = append(all, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan %s: %v", pattern, err)
	}
	slices.Sort(all)
	all = slices.Compact(all)
	var out []sinktest.Message
	for _, key := range all {
		entries, err := rangeRaw(ctx, c, key)
		if err != nil {
			t.Fatalf("XRANGE %s: %v", key, err)
		}
		for _, fields := range entries {
			m := sinktest.Message{Destination: key, Headers: map[string][]string{}, Raw: fields}
			for i := 0; i+1 < len(fields); i += 2 {
				if fields[i] == fieldPayload {
					m.Payload = []byte(fields[i+1])
					continue
				}
				m.Headers[fields[i]] = append(m.Headers[fields[i]], fields[i+1])
			}
			out = append(out, m)
		}
	}
	return out
}

// rangeRaw returns the field-value pairs of every entry of a stream, as
// stored, duplicate field names included (XRangeCmd would fold them into
// a map).
func rangeRaw(ctx context.Context, c *goredis.Client, key string) ([][]string, error) {
	res, err := c.Do(ctx, "XRANGE", key, "-", "+").Slice()
	if err != nil {
		return nil, err
	}
	out := make([][]string, 0, len(res))
	for _, r := range res {
		entry := r.([]any)
		var fields []string
		for _, f := range entry[1].([]any) {
			fields = append(fields, f.(string))
		}
		out = append(out, fields)
	}
	return out, nil
}

// newClient returns a go-redis client for url; the caller closes it.
func newClient(t *testing.T, url string) *goredis.Client {
	t.Helper()
	o, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	o.Protocol = 2 // XRANGE replies as plain arrays
	return goredis.NewClient(o)
}

// tlsFor returns a client TLS configuration trusting the PEM file ca.
func tlsFor(t *testing.T, ca string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool}
}

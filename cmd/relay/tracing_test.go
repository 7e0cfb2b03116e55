package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestTracing runs the relay with tracing.otlp_endpoint pointing at an
// in-process OTLP receiver, over gRPC (host:port) in poll mode and HTTP (a
// URL) in wal mode. A row with a producer's traceparent is published in a
// span of the producer's trace, a child of and linked to the producer's
// span, and reaches NATS with its traceparent and tracestate unchanged; a
// row without one gets a root span whose context is its traceparent on the
// wire. One archive span links to both publish spans. Every span is
// exported by the time SIGTERM's exit returns: shutdown flushes them.
func TestTracing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ mode, transport string }{{"poll", "grpc"}, {"wal", "http"}} {
		t.Run(c.mode, func(t *testing.T) {
			rcv := testenv.StartOTLP(t)
			endpoint := rcv.GRPCAddr
			if c.transport == "http" {
				endpoint = rcv.HTTPURL
			}
			s := newStack(t, stackOptions{Mode: c.mode, Extra: "tracing:\n  otlp_endpoint: " + endpoint + "\n"})
			headers := natsHeaders(t, s.nats.URL())

			producerTrace, producerSpan := randomHex(16), randomHex(8)
			traceparent := "00-" + producerTrace + "-" + producerSpan + "-01"
			traced, plain := uuid.NewString(), uuid.NewString()
			ctx := context.Background()
			if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES
				($1, 'order', 'o-1', 'order.created', '{}', jsonb_build_object('traceparent', $3::text, 'tracestate', 'vendor=abc')),
				($2, 'order', 'o-2', 'order.created', '{}', NULL)`, traced, plain, traceparent); err != nil {
				t.Fatal(err)
			}
			relay := s.start()
			waitFor(t, func() bool { return len(headers(traced)) > 0 && len(headers(plain)) > 0 && s.outboxRows() == 0 })
			if code := relay.stop(t, 30*time.Second); code != 0 {
				t.Fatalf("relay exited %d after SIGTERM, want 0", code)
			}

			if h := headers(traced)[0]; h.Get("traceparent") != traceparent || h.Get("tracestate") != "vendor=abc" {
				t.Errorf("traced row arrived with traceparent %q tracestate %q, want the row's %q and vendor=abc unchanged",
					h.Get("traceparent"), h.Get("tracestate"), traceparent)
			}
			spans := rcv.Spans()
			byID := map[string]testenv.Span{}
			var archives []testenv.Span
			for _, sp := range spans {
				if id := sp.Attrs["messaging.message.id"]; id != "" {
					byID[id] = sp
				}
				if sp.Name == "archive public.outbox" {
					archives = append(archives, sp)
				}
			}
			pt, ok := byID[traced]
			if !ok {
				t.Fatalf("no publish span for the traced row among %d spans", len(spans))
			}
			if pt.TraceID != producerTrace || pt.ParentSpanID != producerSpan ||
				len(pt.Links) != 1 || pt.Links[0].SpanID != producerSpan {
				t.Errorf("traced row's span: trace %s parent %s links %v; want trace %s, parent and link %s",
					pt.TraceID, pt.ParentSpanID, pt.Links, producerTrace, producerSpan)
			}
			for key, want := range map[string]string{"messaging.system": "nats", "messaging.destination.name": "outbox.order",
				"messaging.operation.type": "send", "outbox.aggregate_type": "order", "outbox.aggregate_id": "o-1",
				"outbox.event_type": "order.created"} {
				if pt.Attrs[key] != want {
					t.Errorf("attribute %s = %q, want %q", key, pt.Attrs[key], want)
				}
			}
			if pt.Name != "publish outbox.{aggregate_type}" || pt.Kind.String() != "SPAN_KIND_PRODUCER" ||
				pt.Resource["service.name"] != "relay" || pt.Resource["service.version"] == "" || pt.Transport != c.transport {
				t.Errorf("span %q kind %s resource %v via %s", pt.Name, pt.Kind, pt.Resource, pt.Transport)
			}

			pp, ok := byID[plain]
			if !ok {
				t.Fatal("no publish span for the row without traceparent")
			}
			if pp.ParentSpanID != "" || len(pp.Links) != 0 {
				t.Errorf("row without traceparent: parent %q links %v, want a root span", pp.ParentSpanID, pp.Links)
			}
			if got, want := headers(plain)[0].Get("traceparent"), "00-"+pp.TraceID+"-"+pp.SpanID+"-01"; got != want {
				t.Errorf("row without traceparent arrived with traceparent %q, want its publish span's %q", got, want)
			}

			linked := map[string]bool{}
			for _, a := range archives {
				for _, l := range a.Links {
					linked[l.SpanID] = true
				}
			}
			if !linked[pt.SpanID] || !linked[pp.SpanID] {
				t.Errorf("archive spans %+v do not link both publish spans %s and %s", archives, pt.SpanID, pp.SpanID)
			}
		})
	}
}

// TestTracingCollectorDown points tracing.otlp_endpoint at a port nothing
// listens on: events are still published and archived, and SIGTERM still
// exits 0, the flush of the last spans bounded, with a warning logged.
func TestTracingCollectorDown(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Extra: fmt.Sprintf("tracing:\n  otlp_endpoint: 127.0.0.1:%d\n", freePort(t))})
	headers := natsHeaders(t, s.nats.URL())
	id := uuid.NewString()
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'order', 'o-1', 'order.created', '{}')`, id); err != nil {
		t.Fatal(err)
	}
	relay := s.start()
	waitFor(t, func() bool { return len(headers(id)) > 0 && s.outboxRows() == 0 })
	if code := relay.stop(t, 60*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0", code)
	}
	if logs := relay.logs.String(); !strings.Contains(logs, "tracing: ") {
		t.Errorf("no tracing warning logged:\n%s", logs)
	}
}

// natsHeaders subscribes to outbox.> and returns a function giving the
// headers of every message received so far with a message_id.
func natsHeaders(t *testing.T, url string) func(id string) []nats.Header {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var mu sync.Mutex
	got := map[string][]nats.Header{}
	if _, err := nc.Subscribe("outbox.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		got[m.Header.Get("message_id")] = append(got[m.Header.Get("message_id")], m.Header)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func(id string) []nats.Header {
		mu.Lock()
		defer mu.Unlock()
		return got[id]
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

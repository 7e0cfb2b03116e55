package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
)

const (
	producerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan  = "00f067aa0ba902b7"
	traceparent   = "00-" + producerTrace + "-" + producerSpan + "-01"
)

// fakeSink records what it was given and fails the events named in fail.
type fakeSink struct {
	mu   sync.Mutex
	got  []*event.Event
	fail map[string]bool
}

func (f *fakeSink) Publish(_ context.Context, batch []*event.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, batch...)
	be := &sink.BatchError{Errs: make([]error, len(batch))}
	failed := false
	for i, e := range batch {
		if f.fail[e.ID] {
			be.Errs[i], failed = errors.New("rejected "+e.AggregateType), true
		}
	}
	if failed {
		return be
	}
	return nil
}

func (f *fakeSink) Close() error                        { return nil }
func (f *fakeSink) DestinationOf(e *event.Event) string { return "outbox." + e.AggregateType }
func (f *fakeSink) Probe(context.Context, string) error { return sink.ErrNoProbe }
func (f *fakeSink) sent() []*event.Event                { f.mu.Lock(); defer f.mu.Unlock(); return f.got }
func spanByID(spans []sdktrace.ReadOnlySpan, id string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" && a.Value.AsString() == id {
				return s
			}
		}
	}
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

func newTestTracer() (*Tracer, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return New(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), rec
}

// TestPublishSpans checks the span of each publish: a child of and linked
// to the row's traceparent (tracestate kept), a root span without one, the
// attributes, the error status, and what the sink is given: the row as it
// is, or a copy carrying the publish span's context when it had no
// traceparent.
func TestPublishSpans(t *testing.T) {
	tr, rec := newTestTracer()
	fs := &fakeSink{fail: map[string]bool{"e3": true}}
	s := tr.Sink(fs, "nats", "outbox.{aggregate_type}")
	traced := &event.Event{ID: "e1", AggregateType: "order", AggregateID: "o-1", EventType: "order.created",
		Headers: map[string]string{"traceparent": traceparent, "tracestate": "vendor=abc", "x": "1"}}
	plain := &event.Event{ID: "e2", AggregateType: "order", AggregateID: "o-2", EventType: "order.paid",
		Headers: map[string]string{"x": "2", "tracestate": "stale=1"}}
	invalid := &event.Event{ID: "e3", AggregateType: "order", AggregateID: "o-3", EventType: "order.paid",
		Headers: map[string]string{"traceparent": "garbage"}}
	err := s.Publish(context.Background(), []*event.Event{traced, plain, invalid})
	if sink.Failed(err, 2) == nil || sink.Failed(err, 0) != nil || sink.Failed(err, 1) != nil {
		t.Fatalf("Publish = %v, want only e3 failed", err)
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}

	s1 := spanByID(spans, "e1")
	if got := s1.SpanContext().TraceID().String(); got != producerTrace {
		t.Errorf("e1 trace id %s, want the producer's %s", got, producerTrace)
	}
	if p := s1.Parent(); p.SpanID().String() != producerSpan || !p.IsRemote() || p.TraceState().String() != "vendor=abc" {
		t.Errorf("e1 parent %s (remote %v, state %q), want the producer's span %s with its tracestate", p.SpanID(), p.IsRemote(), p.TraceState(), producerSpan)
	}
	if l := s1.Links(); len(l) != 1 || l[0].SpanContext.SpanID().String() != producerSpan {
		t.Errorf("e1 links %v, want one to the producer's span", l)
	}
	if s1.SpanKind() != trace.SpanKindProducer || s1.Name() != "publish outbox.{aggregate_type}" {
		t.Errorf("e1 span %q kind %v", s1.Name(), s1.SpanKind())
	}
	for key, want := range map[string]string{"messaging.system": "nats", "messaging.destination.name": "outbox.order",
		"messaging.message.id": "e1", "messaging.operation.type": "send", "outbox.aggregate_type": "order",
		"outbox.aggregate_id": "o-1", "outbox.event_type": "order.created"} {
		if got := attr(s1, key); got != want {
			t.Errorf("e1 attribute %s = %q, want %q", key, got, want)
		}
	}

	s2 := spanByID(spans, "e2")
	if s2.Parent().IsValid() || len(s2.Links()) != 0 {
		t.Errorf("e2 has a parent %v or links %v, want a root span", s2.Parent(), s2.Links())
	}
	s3 := spanByID(spans, "e3")
	if s3.Parent().IsValid() || s3.Status().Code.String() != "Error" {
		t.Errorf("e3: parent %v, status %v; want a root span with an error", s3.Parent(), s3.Status())
	}

	sent := fs.sent()
	if sent[0] != traced || sent[2] != invalid {
		t.Error("events with a traceparent header were not passed on as they are")
	}
	want := "00-" + s2.SpanContext().TraceID().String() + "-" + s2.SpanContext().SpanID().String() + "-01"
	if h := sent[1].Headers; h["traceparent"] != want || h["x"] != "2" || h["tracestate"] != "" {
		t.Errorf("e2 sent with headers %v, want traceparent %s, x kept and the stale tracestate gone", h, want)
	}
	if _, ok := plain.Headers["traceparent"]; ok || plain.Headers["tracestate"] != "stale=1" {
		t.Error("the captured event was modified")
	}
}

// fakeSource hands out one batch.
type fakeSource struct{ b *fakeBatch }

func (f *fakeSource) Next(context.Context) (capture.Batch, error) { return f.b, nil }
func (f *fakeSource) Close() error                                { return nil }

type fakeBatch struct {
	events    []*event.Event
	completed bool
}

func (b *fakeBatch) Events() []*event.Event {
	if b.completed {
		return nil
	}
	return b.events
}
func (b *fakeBatch) Complete(context.Context, capture.Outcome) error { b.completed = true; return nil }
func (b *fakeBatch) Abandon(context.Context)                         {}

// TestArchiveSpan checks the archive span of a batch links to the publish
// spans of the events it archives, and that nothing stays recorded.
func TestArchiveSpan(t *testing.T) {
	tr, rec := newTestTracer()
	s := tr.Sink(&fakeSink{fail: map[string]bool{"e2": true}}, "kafka", "t")
	e1 := &event.Event{ID: "e1", Headers: map[string]string{"traceparent": traceparent}}
	e2 := &event.Event{ID: "e2"}
	e3 := &event.Event{ID: "e3"}
	s.Publish(context.Background(), []*event.Event{e1, e2, e3})
	publish := map[string]string{}
	for _, sp := range rec.Ended() {
		publish[attr(sp, "messaging.message.id")] = sp.SpanContext().SpanID().String()
	}

	src := tr.Source(&fakeSource{b: &fakeBatch{events: []*event.Event{e1, e2, e3}}}, "public.outbox", "move")
	b, err := src.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := capture.Outcome{Published: []*event.Event{e1, e3}, Dead: []capture.DeadEvent{{Event: e2}}}
	if err := b.Complete(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	var archive sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "archive public.outbox" {
			archive = sp
		}
	}
	if archive == nil {
		t.Fatal("no archive span")
	}
	links := map[string]bool{}
	for _, l := range archive.Links() {
		links[l.SpanContext.SpanID().String()] = true
	}
	if len(links) != 2 || !links[publish["e1"]] || !links[publish["e3"]] {
		t.Errorf("archive links %v, want the publish spans of e1 and e3 %v", links, publish)
	}
	if attr(archive, "messaging.batch.message_count") != "2" || attr(archive, "outbox.dead_letter.count") != "1" ||
		attr(archive, "outbox.archive.mode") != "move" {
		t.Errorf("archive attributes %v", archive.Attributes())
	}
	n := 0
	tr.published.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d publish spans still recorded after the archive", n)
	}
}

// TestStartExports exports through the OTLP exporters Start builds, to an
// in-process receiver over gRPC (host:port) and HTTP (URL), with the
// relay's resource, and Shutdown flushes the buffered spans.
func TestStartExports(t *testing.T) {
	rcv := testenv.StartOTLP(t)
	for _, c := range []struct{ endpoint, transport string }{{rcv.GRPCAddr, "grpc"}, {rcv.HTTPURL, "http"}} {
		ctx := context.Background()
		tr, err := Start(ctx, c.endpoint, "v9.9.9", testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		id := "via-" + c.transport
		if err := tr.Sink(&fakeSink{}, "sqs", "q").Publish(ctx, []*event.Event{{ID: id}}); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = tr.Shutdown(sctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: shutdown: %v", c.transport, err)
		}
		spans := rcv.Wait(t, 30*time.Second, id, func(spans []testenv.Span) bool {
			for _, s := range spans {
				if s.Attrs["messaging.message.id"] == id {
					return true
				}
			}
			return false
		})
		for _, s := range spans {
			if s.Attrs["messaging.message.id"] != id {
				continue
			}
			if s.Transport != c.transport || s.Resource["service.name"] != "relay" || s.Resource["service.version"] != "v9.9.9" ||
				s.Attrs["messaging.system"] != "aws_sqs" {
				t.Errorf("%s: span %+v", c.transport, s)
			}
		}
	}
}

// TestRowBytesExport: spans of events whose aggregate_type, aggregate_id and
// event_type hold invalid UTF-8, control characters or 100 KB, one of them
// failing with an error quoting them, are exported beside a plain event's
// span, over gRPC and HTTP, with the values escaped and cut.
func TestRowBytesExport(t *testing.T) {
	rcv := testenv.StartOTLP(t)
	long := strings.Repeat("x", 100000)
	for _, c := range []struct{ endpoint, transport string }{{rcv.GRPCAddr, "grpc"}, {rcv.HTTPURL, "http"}} {
		ctx := context.Background()
		tr, err := Start(ctx, c.endpoint, "v9.9.9", testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		plain, bad, failing := "plain-"+c.transport, "bad-"+c.transport, "failing-"+c.transport
		snk := &fakeSink{fail: map[string]bool{failing: true}}
		err = tr.Sink(snk, "nats", "outbox.{aggregate_type}").Publish(ctx, []*event.Event{
			{ID: plain, AggregateType: "order"},
			{ID: bad, AggregateType: "bad\xff\xfe", AggregateID: long, EventType: "\x1b]0;title\x07"},
			{ID: failing, AggregateType: "\xc3(" + long},
		})
		if err == nil {
			t.Fatal("the failing event did not fail")
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = tr.Shutdown(sctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: shutdown: %v", c.transport, err)
		}
		spans := rcv.Wait(t, 30*time.Second, "three spans", func(spans []testenv.Span) bool {
			n := 0
			for _, s := range spans {
				if id := s.Attrs["messaging.message.id"]; id == plain || id == bad || id == failing {
					n++
				}
			}
			return n == 3
		})
		for _, s := range spans {
			if s.Attrs["messaging.message.id"] == bad && (s.Attrs["outbox.aggregate_type"] != `bad\xff\xfe` ||
				s.Attrs["outbox.event_type"] != `\x1b]0;title\a` || len(s.Attrs["outbox.aggregate_id"]) > 300) {
				t.Errorf("%s: span %+v", c.transport, s.Attrs)
			}
		}
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

type orderedSink struct{ fakeSink }

func (*orderedSink) MaxPerAggregate() int { return 50 }

// TestOrderedPassedOn checks that the traced sink keeps the wrapped sink's
// sink.Ordered value, and that an event held back is not an error span.
func TestOrderedPassedOn(t *testing.T) {
	tr, rec := newTestTracer()
	if n := tr.Sink(&orderedSink{}, "kafka", "t").(sink.Ordered).MaxPerAggregate(); n != 50 {
		t.Errorf("MaxPerAggregate %d through the traced sink, want the wrapped sink's 50", n)
	}
	if n := tr.Sink(&fakeSink{}, "nats", "t").(sink.Ordered).MaxPerAggregate(); n != 1 {
		t.Errorf("MaxPerAggregate %d for a sink without sink.Ordered, want 1", n)
	}
	held := heldSink{}
	tr.Sink(&held, "kafka", "t").Publish(context.Background(), []*event.Event{{ID: "e1"}})
	sp := rec.Ended()[0]
	if sp.Status().Code.String() == "Error" || attr(sp, "outbox.held_back") != "true" {
		t.Errorf("held-back event: status %v, attributes %v; want no error and outbox.held_back", sp.Status(), sp.Attributes())
	}
}

type heldSink struct{ fakeSink }

func (*heldSink) Publish(context.Context, []*event.Event) error {
	return &sink.BatchError{Errs: []error{fmt.Errorf("later: %w", sink.ErrHeldBack)}}
}

// Package tracing exports OpenTelemetry spans for the relay's publishes and
// archives through OTLP. It wraps a sink and a capture source; with tracing
// off the relay does not use it at all, so it costs nothing then. See
// docs/configuration.md ("Tracing") for the spans and their links.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/event"
)

// Header names of the W3C trace context in an outbox row's headers.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// instrumentation is the name of the relay's tracer.
const instrumentation = "github.com/outboxrelay/relay"

// Tracer makes the relay's spans. Its methods are safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	// shutdown flushes and stops the provider; nil for a Tracer built on a
	// provider owned by someone else (tests).
	shutdown func(context.Context) error
	// published holds, for each event acknowledged by a traced sink and
	// not yet archived, the context of the span that published it, for the
	// archive span's links.
	published sync.Map // *event.Event -> trace.SpanContext
}

// Start returns a Tracer exporting to endpoint, tracing.otlp_endpoint:
// host:port for OTLP/gRPC without TLS, an http:// or https:// URL for
// OTLP/HTTP (path /v1/traces when the URL has none). A URL with
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL set to
// grpc uses OTLP/gRPC, with TLS for https. The other OTEL_* variables the
// SDK reads apply (headers, timeout, compression, certificates, batching,
// sampler, resource attributes). version is the relay's, for service.version.
// Nothing is dialled here: an unreachable collector only makes exports fail,
// which are logged on log.
func Start(ctx context.Context, endpoint, version string, log *slog.Logger) (*Tracer, error) {
	exp, err := newExporter(ctx, endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing.otlp_endpoint: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("relay"), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed", "err", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracer{tracer: tp.Tracer(instrumentation, trace.WithInstrumentationVersion(version)), shutdown: tp.Shutdown}, nil
}

// New returns a Tracer that makes its spans with tp and never shuts it down.
func New(tp trace.TracerProvider) *Tracer {
	return &Tracer{tracer: tp.Tracer(instrumentation)}
}

// Shutdown exports the spans still buffered and stops the exporter; ctx
// bounds how long it waits for the collector.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// newExporter builds the OTLP exporter endpoint selects.
func newExporter(ctx context.Context, endpoint string) (sdktrace.SpanExporter, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
	}
	if protocol() == "grpc" {
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
}

// protocol returns the OTLP protocol the environment asks for traces, or "".
func protocol() string {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" {
			return v
		}
	}
	return ""
}

// propagator reads and writes traceparent and tracestate.
var propagator = propagation.TraceContext{}

// creationContext returns the span context in e's traceparent and
// tracestate headers; it is not valid when e has none or an invalid one.
func creationContext(e *event.Event) trace.SpanContext {
	if e.Headers[HeaderTraceparent] == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier(e.Headers)))
}

// withContext returns a copy of e whose headers carry sc as traceparent
// (and tracestate when sc has one).
func withContext(e *event.Event, sc trace.SpanContext) *event.Event {
	c := *e
	c.Headers = make(map[string]string, len(e.Headers)+2)
	for k, v := range e.Headers {
		c.Headers[k] = v
	}
	delete(c.Headers, HeaderTracestate)
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.MapCarrier(c.Headers))
	return &c
}

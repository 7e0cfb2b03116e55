package outbox

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header names of the W3C trace context that Write adds to an event's
// headers.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// traceHeaders returns h with the W3C trace context of ctx's span as
// traceparent and tracestate, or h itself when ctx carries no valid span
// context or h already has a traceparent. h is never modified.
func traceHeaders(ctx context.Context, h map[string]string) map[string]string {
	if _, set := h[HeaderTraceparent]; set || !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	out := make(map[string]string, len(h)+2)
	for k, v := range h {
		if k != HeaderTracestate {
			out[k] = v
		}
	}
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(out))
	return out
}

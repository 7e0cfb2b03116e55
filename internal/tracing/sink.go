package tracing

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
)

// Routed is a sink that names each event's destination; every broker sink
// is one.
type Routed interface {
	sink.Sink
	sink.Destinations
}

// Attribute keys of the outbox row that the spans carry.
const (
	AttrAggregateType = attribute.Key("outbox.aggregate_type")
	AttrAggregateID   = attribute.Key("outbox.aggregate_id")
	AttrEventType     = attribute.Key("outbox.event_type")
	// AttrHeldBack marks the span of an event the sink did not send because
	// an earlier event of its aggregate in the call failed (sink.ErrHeldBack);
	// it is sent again later.
	AttrHeldBack = attribute.Key("outbox.held_back")
)

// systems maps sink.type to messaging.system.
var systems = map[string]string{"kafka": "kafka", "nats": "nats", "pubsub": "gcp_pubsub", "rabbitmq": "rabbitmq", "redis": "redis", "sqs": "aws_sqs", "webhook": "webhook"}

// Sink returns next with a span per event publish. sinkType is sink.type;
// template is the configured destination template (without credentials),
// which names the spans "publish <template>".
//
// Each span is a producer span, a child of the event's creation context
// (the row's traceparent, with its tracestate) and linked to it, or a root
// span when the row has no valid traceparent. The row's headers go to the
// broker unchanged; a row with no traceparent header at all is sent with
// the publish span's context as its traceparent, so consumers can still
// join the trace.
func (t *Tracer) Sink(next Routed, sinkType, template string) Routed {
	return &tracedSink{Routed: next, t: t, name: "publish " + template,
		common: []attribute.KeyValue{
			semconv.MessagingSystemKey.String(systems[sinkType]),
			semconv.MessagingOperationName("publish"),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationTemplate(template),
		}}
}

type tracedSink struct {
	Routed
	t      *Tracer
	name   string
	common []attribute.KeyValue
}

// Publish starts one span per event, publishes the batch and ends each span
// with its event's outcome.
func (s *tracedSink) Publish(ctx context.Context, batch []*event.Event) error {
	spans := make([]trace.Span, len(batch))
	out, copied := batch, false
	for i, e := range batch {
		span, send := s.start(ctx, e)
		spans[i] = span
		if send != e {
			if !copied {
				out, copied = append([]*event.Event(nil), batch...), true
			}
			out[i] = send
		}
	}
	err := s.Routed.Publish(ctx, out)
	for i, span := range spans {
		if ferr := sink.Failed(err, i); errors.Is(ferr, sink.ErrHeldBack) {
			span.SetAttributes(AttrHeldBack.Bool(true))
		} else if ferr != nil {
			recordError(span, ferr)
		} else {
			s.t.published.Store(batch[i], span.SpanContext())
		}
		span.End()
	}
	return err
}

// RowChosen passes the wrapped sink's sink.RowRouted answer on.
func (s *tracedSink) RowChosen() bool { return sink.RowChosen(s.Routed) }

// MaxPerAggregate passes the wrapped sink's sink.Ordered capability on to
// the pipeline: its value, or 1 (one event of an aggregate per publish)
// when it has none.
func (s *tracedSink) MaxPerAggregate() int {
	if o, ok := s.Routed.(sink.Ordered); ok {
		return o.MaxPerAggregate()
	}
	return 1
}

// recordError records err on span as an exception event and an error
// status, its message escaped and cut with rowtext.Error: it may quote row
// values, and one string that is not UTF-8 makes the exporter drop every
// span of its batch.
func recordError(span trace.Span, err error) {
	msg := rowtext.Error(err.Error())
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
		semconv.ExceptionType(fmt.Sprintf("%T", err)), semconv.ExceptionMessage(msg)))
	span.SetStatus(codes.Error, msg)
}

// start starts e's publish span and returns it with the event to send: e,
// or a copy carrying the span's context when e has no traceparent.
func (s *tracedSink) start(ctx context.Context, e *event.Event) (trace.Span, *event.Event) {
	attrs := append(s.common[:len(s.common):len(s.common)],
		semconv.MessagingDestinationName(rowtext.Value(s.DestinationOf(e))),
		semconv.MessagingMessageID(rowtext.Value(e.ID)),
		AttrAggregateType.String(rowtext.Value(e.AggregateType)),
		AttrAggregateID.String(rowtext.Value(e.AggregateID)),
		AttrEventType.String(rowtext.Value(e.EventType)))
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	if parent := creationContext(e); parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: parent}))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	_, span := s.t.tracer.Start(ctx, s.name, opts...)
	if _, has := e.Headers[HeaderTraceparent]; has || !span.SpanContext().IsValid() {
		return span, e
	}
	return span, withContext(e, span.SpanContext())
}

package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/capture"
)

// Attribute keys of the archive spans.
const (
	AttrArchiveMode   = attribute.Key("outbox.archive.mode")
	AttrDeadLettered  = attribute.Key("outbox.dead_letter.count")
	archiveOperation  = "archive"
	archiveSpanPrefix = archiveOperation + " "
)

// Source returns next with a span per batch archive, named
// "archive <table>", linked to the publish span of each event the batch
// archives (up to the SDK's link limit, 128 by default). table is the
// outbox table and mode archive.mode.
func (t *Tracer) Source(next capture.Source, table, mode string) capture.Source {
	return &tracedSource{Source: next, t: t, name: archiveSpanPrefix + table,
		attrs: []attribute.KeyValue{semconv.DBSystemNamePostgreSQL, semconv.DBCollectionName(table), AttrArchiveMode.String(mode)}}
}

type tracedSource struct {
	capture.Source
	t     *Tracer
	name  string
	attrs []attribute.KeyValue
}

// Next returns the next batch, traced.
func (s *tracedSource) Next(ctx context.Context) (capture.Batch, error) {
	b, err := s.Source.Next(ctx)
	if b == nil {
		return b, err
	}
	return &tracedBatch{Batch: b, s: s}, err
}

type tracedBatch struct {
	capture.Batch
	s *tracedSource
}

// Complete archives the batch inside a span linked to its events' publish
// spans.
func (b *tracedBatch) Complete(ctx context.Context, o capture.Outcome) error {
	links := make([]trace.Link, 0, len(o.Published))
	for _, e := range o.Published {
		if v, ok := b.s.t.published.Load(e); ok {
			links = append(links, trace.Link{SpanContext: v.(trace.SpanContext)})
		}
	}
	b.forget()
	attrs := append(b.s.attrs[:len(b.s.attrs):len(b.s.attrs)],
		semconv.MessagingBatchMessageCount(len(o.Published)), AttrDeadLettered.Int(len(o.Dead)))
	ctx, span := b.s.t.tracer.Start(ctx, b.s.name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithNewRoot(), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	defer span.End()
	err := b.Batch.Complete(ctx, o)
	if err != nil {
		recordError(span, err)
	}
	return err
}

// Abandon releases the batch.
func (b *tracedBatch) Abandon(ctx context.Context) {
	b.forget()
	b.Batch.Abandon(ctx)
}

// forget drops the recorded publish spans of the batch's events, which
// leave the relay now whatever happened to them.
func (b *tracedBatch) forget() {
	for _, e := range b.Batch.Events() {
		b.s.t.published.Delete(e)
	}
}

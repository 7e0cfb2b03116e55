package tracing

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxrelay/relay/event"
)

// BenchmarkTracedPublish measures what tracing adds per event when on: a
// batch of 100 events, half with a traceparent, through the traced sink to
// a sink that does nothing, spans batched to an exporter that drops them.
// With tracing off the relay does not wrap the sink, so it adds nothing.
func BenchmarkTracedPublish(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer tp.Shutdown(context.Background())
	s := New(tp).Sink(&nopSink{}, "nats", "outbox.{aggregate_type}")
	batch := make([]*event.Event, 100)
	for i := range batch {
		batch[i] = &event.Event{ID: fmt.Sprint("e", i), AggregateType: "order", AggregateID: fmt.Sprint("o-", i), EventType: "created"}
		if i%2 == 0 {
			batch[i].Headers = map[string]string{"traceparent": traceparent}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Publish(context.Background(), batch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/event")
}

type nopSink struct{ fakeSink }

func (*nopSink) Publish(context.Context, []*event.Event) error { return nil }

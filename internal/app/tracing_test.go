package app

import (
	"context"
	"testing"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/sink"
)

// TestTracingOff checks that with tracing.otlp_endpoint empty no tracer
// starts and the sink and source are used as they are, so the hot path
// does no tracing work.
func TestTracingOff(t *testing.T) {
	r := &Relay{cfg: &config.Config{}}
	tr, err := r.startTracing(context.Background())
	if tr != nil || err != nil || len(r.closers) != 0 {
		t.Fatalf("startTracing = %v, %v with %d closers; want nothing started", tr, err, len(r.closers))
	}
	snk := &brokerSink{}
	if got := tracedSink(nil, snk, config.Sink{Type: "nats"}); got != sink.Sink(snk) {
		t.Errorf("tracedSink wrapped the sink: %T", got)
	}
	var src capture.Source = &dbFailures{}
	if got := tracedSource(nil, src, &config.Config{}); got != src {
		t.Errorf("tracedSource wrapped the source: %T", got)
	}
}

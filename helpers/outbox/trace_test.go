package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/helpers/outbox"
)

// TestWriteTraceContext writes events from a context with a span, one
// without, and with a traceparent already set: the first rows carry the
// span's traceparent and tracestate beside their own headers, the others
// are left as they were.
func TestWriteTraceContext(t *testing.T) {
	pool, _ := setup(t, outbox.DDL)
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, TraceState: ts,
	})
	const want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	mine := map[string]string{"tenant": "acme", "tracestate": "stale=1"}
	ev := func(agg string, h map[string]string) outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "order.created", Payload: []byte(`{}`), Headers: h}
	}
	if _, err := outbox.WriteMany(ctx, pool, ev("traced", nil), ev("traced-with-headers", mine)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Write(context.Background(), pool, ev("no-span", nil)); err != nil {
		t.Fatal(err)
	}
	own := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
	if _, err := outbox.Write(ctx, pool, ev("own", own)); err != nil {
		t.Fatal(err)
	}
	if mine["traceparent"] != "" || mine["tracestate"] != "stale=1" {
		t.Errorf("the caller's headers map was modified: %v", mine)
	}

	got := map[string]map[string]string{}
	for _, r := range rows(t, pool) {
		var h map[string]string
		if r.Headers != nil {
			if err := json.Unmarshal([]byte(*r.Headers), &h); err != nil {
				t.Fatal(err)
			}
		}
		got[r.AggregateID] = h
	}
	for agg, w := range map[string]map[string]string{
		"traced":              {"traceparent": want, "tracestate": "vendor=abc"},
		"traced-with-headers": {"traceparent": want, "tracestate": "vendor=abc", "tenant": "acme"},
		"no-span":             nil,
		"own":                 own,
	} {
		if len(got[agg]) != len(w) {
			t.Errorf("%s: headers %v, want %v", agg, got[agg], w)
			continue
		}
		for k, v := range w {
			if got[agg][k] != v {
				t.Errorf("%s: headers %v, want %v", agg, got[agg], w)
			}
		}
	}
}

package template

import (
	"testing"

	"github.com/outboxrelay/relay/event"
)

func TestTemplateRender(t *testing.T) {
	dots := func(r rune) rune {
		if r == '.' {
			return '_'
		}
		return r
	}
	e := &event.Event{AggregateType: "order.v2", EventType: "paid", AggregateID: "o-1"}
	for _, tc := range []struct{ tmpl, want string }{
		{"outbox.{aggregate_type}", "outbox.order_v2"},
		{"fixed", "fixed"},
		{"{aggregate_type}", "order_v2"},
		{"a.{event_type}.{aggregate_id}.z", "a.paid.o-1.z"},
		{"{aggregate_id}{aggregate_id}", "o-1o-1"},
	} {
		tp, err := Parse(tc.tmpl, dots)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.Render(e); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.tmpl, got, tc.want)
		}
	}
	tp, _ := Parse("x.{event_type}", nil)
	if got := tp.Render(&event.Event{}); got != "x._" {
		t.Errorf("empty value: got %q, want x._", got)
	}
	for _, bad := range []string{"x.{nope}", "x.{aggregate_type"} {
		if _, err := Parse(bad, nil); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func BenchmarkTemplateRender(b *testing.B) {
	tp, _ := Parse("outbox.{aggregate_type}", func(r rune) rune { return r })
	e := &event.Event{AggregateType: "order", AggregateID: "order-1234"}
	b.ReportAllocs()
	for b.Loop() {
		_ = tp.Render(e)
	}
}

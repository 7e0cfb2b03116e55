package pipeline

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/event"
)

// TestPublishedByType counts acknowledged events per aggregate_type.
func TestPublishedByType(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "nats")
	now := time.Now()
	for _, typ := range []string{"order", "invoice", "order"} {
		m.acked(&event.Event{AggregateType: typ, CreatedAt: now}, now)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "relay_events_published_by_type_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "aggregate_type" {
					got[l.GetValue()] = s.GetCounter().GetValue()
				}
			}
		}
	}
	if len(got) != 2 || got["order"] != 2 || got["invoice"] != 1 {
		t.Errorf("published by type %v, want order 2, invoice 1", got)
	}
}

// BenchmarkAcked records the metrics of one acknowledged event.
func BenchmarkAcked(b *testing.B) {
	m := NewMetrics(prometheus.NewRegistry(), "nats")
	ev := &event.Event{AggregateType: "order", CreatedAt: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		m.acked(ev, time.Now())
	}
}

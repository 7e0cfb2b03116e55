package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// TestPublishedByType counts acknowledged events per aggregate_type.
func TestPublishedByType(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "nats")
	now := time.Now()
	for _, typ := range []string{"order", "invoice", "order"} {
		m.acked(&event.Event{AggregateType: typ, CreatedAt: now}, now)
	}
	if got := publishedByType(t, reg); len(got) != 2 || got["order"] != 2 || got["invoice"] != 1 {
		t.Errorf("published by type %v, want order 2, invoice 1", got)
	}
}

// publishedByType gathers reg and returns relay_events_published_by_type_total
// by aggregate_type label.
func publishedByType(t testing.TB, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
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
	return got
}

// TestPublishedByTypeBounded: 20,000 distinct aggregate types make
// MaxLabelValues series and "other"; a long type, one with a newline, an
// escape sequence or invalid UTF-8 is escaped and cut.
func TestPublishedByTypeBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "nats")
	now := time.Now()
	odd := []string{strings.Repeat("x", 10000), "new\nline", "\x1b]0;title\x07", "bad\xff\xfe"}
	for _, typ := range odd {
		m.acked(&event.Event{AggregateType: typ}, now)
	}
	for i := range 20000 {
		m.acked(&event.Event{AggregateType: fmt.Sprintf("type-%d", i)}, now)
	}
	got := publishedByType(t, reg)
	if other := 20000 - (MaxLabelValues - len(odd)); len(got) != MaxLabelValues+1 || got[OtherLabel] != float64(other) {
		t.Errorf("%d series, other %v; want %d and %d", len(got), got[OtherLabel], MaxLabelValues+1, other)
	}
	for _, want := range []string{strings.Repeat("x", 64) + "...(10000 bytes)", `new\nline`, `\x1b]0;title\a`, `bad\xff\xfe`} {
		if got[want] != 1 {
			t.Errorf("no series %q: %v", want, got)
		}
	}
}

// FuzzPublishedByType: whatever bytes an aggregate_type holds, counting it
// does not panic and its series has a valid, bounded label without control
// characters.
func FuzzPublishedByType(f *testing.F) {
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a\nb\r\x00", "\u202e\u009b", strings.Repeat("é", 40)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, typ string) {
		reg := prometheus.NewRegistry()
		NewMetrics(reg, "nats").acked(&event.Event{AggregateType: typ}, time.Now())
		got := publishedByType(t, reg)
		if len(got) != 1 {
			t.Fatalf("%d series for one type: %v", len(got), got)
		}
		for label := range got {
			if !utf8.ValidString(label) || len(label) > rowtext.LabelBytes+32 ||
				strings.ContainsFunc(label, unicode.IsControl) {
				t.Fatalf("label %q of type %q", label, typ)
			}
		}
	})
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

package pipeline

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// MaxLabelValues is the most values a metric label that comes from row data
// takes, which bounds the series: the aggregate_type of
// relay_events_published_by_type_total (the types after the first
// MaxLabelValues count under OtherLabel) and the destination of the broken
// destinations (Destinations lists at most this many). Such label values
// are also escaped and cut with rowtext.Label.
const MaxLabelValues = 32

// OtherLabel is the aggregate_type label of the events whose type came after
// MaxLabelValues others.
const OtherLabel = "other"

// Metrics are the pipeline's Prometheus histograms and labelled counters;
// the plain counters live in Stats. A nil *Metrics records nothing. Safe for
// concurrent use.
type Metrics struct {
	publishSeconds prometheus.Histogram
	ackLagSeconds  prometheus.Histogram
	published      *prometheus.CounterVec
	errors         *prometheus.CounterVec

	mu     sync.Mutex
	byType map[string]prometheus.Counter // published's counter of each label value, at most MaxLabelValues
	other  prometheus.Counter            // published's counter of the types beyond them; nil until one is seen
}

// NewMetrics registers the pipeline's metrics on reg. sinkType labels the
// published counter.
func NewMetrics(reg prometheus.Registerer, sinkType string) *Metrics {
	m := &Metrics{
		publishSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "relay", Name: "publish_batch_duration_seconds",
			Help:    "Time one Publish call took, from send to the last acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		ackLagSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "relay", Name: "commit_to_ack_seconds",
			Help:    "Time from an event's created_at to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "relay", Name: "events_published_by_type_total",
			Help:        "Events acknowledged by the sink, by aggregate_type (the usual destination): the first 32 types seen, escaped and cut to 64 bytes; the others count as \"other\".",
			ConstLabels: prometheus.Labels{"sink": sinkType},
		}, []string{"aggregate_type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "relay", Name: "publish_errors_total",
			Help: "Failed publish attempts, by error class (transient, unavailable, permanent).",
		}, []string{"class"}),
		byType: make(map[string]prometheus.Counter),
	}
	reg.MustRegister(m.publishSeconds, m.ackLagSeconds, m.published, m.errors)
	return m
}

func (m *Metrics) publishDone(d time.Duration) {
	if m != nil {
		m.publishSeconds.Observe(d.Seconds())
	}
}

func (m *Metrics) acked(ev *event.Event, now time.Time) {
	if m == nil {
		return
	}
	m.byTypeCounter(ev.AggregateType).Inc()
	if !ev.CreatedAt.IsZero() {
		m.ackLagSeconds.Observe(now.Sub(ev.CreatedAt).Seconds())
	}
}

// byTypeCounter returns the published counter of aggregate type typ: its
// own for the first MaxLabelValues label values, the other counter beyond.
func (m *Metrics) byTypeCounter(typ string) prometheus.Counter {
	label := rowtext.Label(typ)
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byType[label]; c != nil {
		return c
	}
	if len(m.byType) >= MaxLabelValues {
		if m.other == nil {
			m.other = m.published.WithLabelValues(OtherLabel)
		}
		return m.other
	}
	label = strings.Clone(label) // it may share the memory of the whole row
	c := m.published.WithLabelValues(label)
	m.byType[label] = c
	return c
}

func (m *Metrics) failed(c fault.Class) {
	if m != nil {
		m.errors.WithLabelValues(c.String()).Inc()
	}
}

package pipeline

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// Metrics are the pipeline's Prometheus histograms and labelled counters;
// the plain counters live in Stats. A nil *Metrics records nothing. Safe for
// concurrent use.
type Metrics struct {
	publishSeconds prometheus.Histogram
	ackLagSeconds  prometheus.Histogram
	published      *prometheus.CounterVec
	errors         *prometheus.CounterVec

	mu     sync.Mutex
	byType map[string]prometheus.Counter // published's counter of each aggregate_type seen
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
			Help:        "Events acknowledged by the sink, by aggregate_type (the usual destination).",
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
	m.mu.Lock()
	c := m.byType[ev.AggregateType]
	if c == nil {
		c = m.published.WithLabelValues(ev.AggregateType)
		m.byType[ev.AggregateType] = c
	}
	m.mu.Unlock()
	c.Inc()
	if !ev.CreatedAt.IsZero() {
		m.ackLagSeconds.Observe(now.Sub(ev.CreatedAt).Seconds())
	}
}

func (m *Metrics) failed(c fault.Class) {
	if m != nil {
		m.errors.WithLabelValues(c.String()).Inc()
	}
}

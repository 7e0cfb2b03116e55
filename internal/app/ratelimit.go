package app

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/sink/ratelimit"
)

// limitRate puts snk behind sink.rate_limit when it is set, registers the
// limiter's metrics on reg and returns the batch size and in-flight window
// to run the pipeline with. Batches are at most the burst, so a receiver
// never gets more than a burst at once. The window is about one second of
// events, and at least one capture batch so that the next batch is read
// while this one is published: holding more would only delay their
// archiving and make a stop drain longer than shutdown_timeout, after which
// the events published but not archived are published again. Without a
// limit it returns batch and pipelineWindow.
func limitRate(snk *brokerSink, c config.RateLimit, reg prometheus.Registerer, log *slog.Logger, batch int) (int, int) {
	if c.EventsPerSecond <= 0 {
		return batch, pipelineWindow
	}
	lim := ratelimit.New(snk.routedSink, c.EventsPerSecond, c.Burst)
	snk.routedSink = lim
	log.Info("publish rate limited", "events_per_second", c.EventsPerSecond, "burst", lim.Burst())
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: "rate_limit_events_per_second",
			Help: "The publish rate limit (sink.rate_limit.events_per_second)."},
			func() float64 { return float64(c.EventsPerSecond) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "rate_limit_wait_seconds_total",
			Help: "Time publish calls spent waiting for the rate limit, summed over concurrent calls (included in relay_publish_batch_duration_seconds)."},
			func() float64 { return lim.Waited().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: "rate_limit_waiting_events",
			Help: "Events waiting for the rate limit now."},
			func() float64 { return float64(lim.Waiting()) }),
	)
	return min(batch, lim.Burst()), min(pipelineWindow, max(c.EventsPerSecond, batch))
}

package app

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// handler serves /healthz (the process is alive), /readyz (capture works
// and the sink is reachable) and /metrics.
func (r *Relay) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch st := r.Stats(); {
		case !st.Capturing.Load():
			http.Error(w, "capture failing (is Postgres reachable?)", http.StatusServiceUnavailable)
			return
		case !st.Ready.Load():
			http.Error(w, "sink unreachable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.registry(), promhttp.HandlerOpts{}))
	return mux
}

// registry exposes the pipeline's counters.
func (r *Relay) registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	st := r.Stats()
	counter := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: name, Help: help}, f))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: name, Help: help}, f))
	}
	counter("events_captured_total", "Events read from the outbox.", func() float64 { return float64(st.Captured.Load()) })
	counter("events_published_total", "Events acknowledged by the sink.", func() float64 { return float64(st.Published.Load()) })
	counter("events_dead_lettered_total", "Events moved to the dead-letter table.", func() float64 { return float64(st.DeadLettered.Load()) })
	counter("publish_retries_total", "Failed publish attempts that were retried.", func() float64 { return float64(st.Retries.Load()) })
	counter("events_archived_total", "Events archived after publishing.", func() float64 { return float64(st.Archived.Load()) })
	gauge("events_in_flight", "Events captured and not yet settled.", func() float64 { return float64(st.InFlight.Load()) })
	gauge("sink_ready", "1 when the sink is reachable.", func() float64 {
		if st.Ready.Load() {
			return 1
		}
		return 0
	})
	return reg
}

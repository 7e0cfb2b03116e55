package app

import (
	"net/http"

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
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	return mux
}

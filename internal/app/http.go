package app

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/pipeline"
)

// handler serves /healthz (the process is alive), /readyz (capture works
// and no destination is broken; otherwise 503 naming each broken
// destination, since when and why), /status (the relay's state as JSON, for
// relay status), /metrics, and with http.pprof the
// runtime profiles under /debug/pprof/.
func (r *Relay) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.dbFailures.failing(); err != nil {
			http.Error(w, "database refuses the relay: "+redact.String(err.Error()), http.StatusServiceUnavailable)
			return
		}
		switch st := r.Stats(); {
		case !st.Capturing():
			http.Error(w, "capture failing (is Postgres reachable?)", http.StatusServiceUnavailable)
			return
		case st.Ready.Load() && !st.SinkReady():
			http.Error(w, fmt.Sprintf("a publish has waited %s for the broker (over %s): treated as unreachable",
				st.PublishWait().Round(time.Millisecond), pipeline.StallAfter), http.StatusServiceUnavailable)
			return
		case !st.Ready.Load():
			var b strings.Builder
			fmt.Fprintf(&b, "%d destination(s) broken; their events are held, none is dead-lettered\n", st.Broken.Load())
			for _, d := range r.pipeline.Destinations() {
				fmt.Fprintf(&b, "destination %s broken since %s: %s\n", rowtext.Value(d.Name), d.Since.UTC().Format(time.RFC3339),
					rowtext.Error(redact.String(d.Err)))
			}
			http.Error(w, strings.TrimSuffix(b.String(), "\n"), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /status", r.serveLive)
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}))
	if r.cfg.HTTP.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

package app

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/rowtext"
	rabbitmqsink "github.com/outboxrelay/relay/sink/rabbitmq"
	redissink "github.com/outboxrelay/relay/sink/redis"
)

// startRetryMax caps the wait between two attempts to start while Postgres
// or the broker cannot be reached (retry.max when that is smaller).
const startRetryMax = 5 * time.Second

// front is relay run's HTTP handler: while the relay waits to start it
// answers /healthz 200, /readyz 503 saying what it waits for, /status with
// capturing false and what it waits for, and /metrics
// with relay_capture_ready and relay_sink_ready at 0 and
// relay_start_attempts_total; once the relay is open, the relay's own
// handler. It is safe for concurrent use.
type front struct {
	h        atomic.Pointer[http.Handler]
	waiting  atomic.Pointer[string] // why the relay is not running yet
	dbReady  atomic.Bool            // Postgres answered the last attempt
	attempts atomic.Int64
	bound    net.Addr // the listener's address, set before it serves
}

// newFront returns a front serving the waiting endpoints.
func newFront() *front {
	f := &front{}
	reg := newRegistry()
	gauge := func(name, help string, v func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: name, Help: help}, v))
	}
	gauge("capture_ready", "1 while capture works: Postgres answers and accepts the relay's statements.",
		func() float64 { return boolFloat(f.dbReady.Load()) })
	gauge("sink_ready", "1 when the broker and fixed destinations work, not every destination rows chose is broken, and no publish has waited over 5s for the broker.", func() float64 { return 0 })
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "start_attempts_total",
		Help: "Attempts to start while Postgres or the broker could not be reached."},
		func() float64 { return float64(f.attempts.Load()) }))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		msg := "starting"
		if p := f.waiting.Load(); p != nil {
			msg = "not started yet, retrying: " + *p
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		s := newLiveStatus()
		s.Starting = "starting"
		if p := f.waiting.Load(); p != nil {
			s.Starting = "not started yet, retrying: " + rowtext.Error(*p)
		}
		writeLive(w, s)
	})
	f.set(mux)
	return f
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) { (*f.h.Load()).ServeHTTP(w, r) }

// set makes h serve every later request.
func (f *front) set(h http.Handler) { f.h.Store(&h) }

// failed records a failed attempt to start.
func (f *front) failed(err error, dbReady bool) {
	msg := redact.String(err.Error())
	f.waiting.Store(&msg)
	f.dbReady.Store(dbReady)
	f.attempts.Add(1)
}

// openWhenReachable opens the relay for relay run. While Postgres or the
// broker cannot be reached it reports not ready on f and tries again, after
// retry.initial doubling up to startRetryMax (or retry.max if smaller). A
// bad config, refused credentials or a missing object end it at once with
// the error; ctx ending ends it with a nil Relay and nil error.
func openWhenReachable(ctx context.Context, cfg *config.Config, log *slog.Logger, f *front) (*Relay, error) {
	delay, ceiling := cfg.Retry.Initial.D(), min(cfg.Retry.Max.D(), startRetryMax)
	var last string
	for {
		r := &Relay{cfg: cfg, log: log, front: f}
		err := r.open(ctx)
		if err == nil {
			return r, nil
		}
		r.Close()
		if ctx.Err() != nil {
			return nil, nil
		}
		if !unreachable(err) {
			return nil, err
		}
		f.failed(err, r.pool != nil)
		if msg := redact.String(err.Error()); msg != last {
			log.Warn("cannot start yet: waiting for Postgres and the broker (not ready)", "err", msg, "retry_in", delay)
			last = msg
		} else {
			log.Debug("still waiting to start", "err", msg, "retry_in", delay)
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(delay):
		}
		delay = min(2*delay, ceiling)
	}
}

// unreachable reports whether err, from opening the relay, says that
// Postgres or the broker cannot be reached yet: refused or lost connections,
// timeouts, DNS failures, a server starting up or shutting down, too many
// connections, or a sink's error classed unavailable. Refused credentials
// (PostgreSQL class 28, broker authentication), a bad config, a missing
// table, privilege or database are not.
func unreachable(err error) bool {
	var ue *UsageError
	if errors.As(err, &ue) || credentialsRefused(err) {
		return false
	}
	if pe := pgerr.Of(err); pe != nil {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "53") ||
			pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ne net.Error
	return errors.As(err, &ne) || pgconn.Timeout(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || fault.ClassOf(err) == fault.Unavailable
}

// credentialsRefused reports whether err says the database or the broker
// refused the relay's credentials.
func credentialsRefused(err error) bool {
	if pe := pgerr.Of(err); pe != nil {
		return strings.HasPrefix(pe.Code, "28")
	}
	if rabbitmqsink.CredentialsRefused(err) {
		return true
	}
	for _, target := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired,
		kerr.SaslAuthenticationFailed, kerr.IllegalSaslState, kerr.UnsupportedSaslMechanism, redissink.ErrCredentialsRefused} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

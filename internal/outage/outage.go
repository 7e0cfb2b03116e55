// Package outage keeps a retried operation's failures from flooding the
// log while a server is down: a run of failures is logged as its first
// failure, a periodic summary and one line when the operation works again,
// not as one line per attempt.
package outage

import (
	"log/slog"
	"sync"
	"time"
)

// SummaryEvery is the least time between two warnings about one run of
// failures.
const SummaryEvery = time.Minute

// Log reports the failures of one retried operation: the first failure of
// a run at WARN with its error, each later one at DEBUG, at most one WARN
// summary per SummaryEvery while the run lasts (the attempts so far, for
// how long, the last error), and one INFO line when the operation works
// again. It is safe for concurrent use.
type Log struct {
	log           *slog.Logger
	failed, works string
	now           func() time.Time

	mu       sync.Mutex
	since    time.Time // when the run of failures began; zero outside one
	warned   time.Time // when the run was last logged at WARN
	attempts int       // failed attempts of the run
}

// New returns a Log writing to log that says failed (for example "capture
// failed, retrying") when a run of failures begins and works (for example
// "capture works again") when it ends.
func New(log *slog.Logger, failed, works string) *Log {
	return &Log{log: log, failed: failed, works: works, now: time.Now}
}

// Fail records a failed attempt with its error and the key-value pairs of
// args (as slog takes them), and returns how many attempts of the run have
// failed, for the caller's backoff.
func (l *Log) Fail(err error, args ...any) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.attempts++
	args = append([]any{"err", err}, args...)
	switch {
	case l.since.IsZero():
		l.since, l.warned = now, now
		l.log.Warn(l.failed, args...)
	case now.Sub(l.warned) >= SummaryEvery:
		l.warned = now
		l.log.Warn("still failing: "+l.failed, append(args, "attempts", l.attempts,
			"failing_for", now.Sub(l.since).Round(time.Second))...)
	default:
		l.log.Debug(l.failed, append(args, "attempt", l.attempts)...)
	}
	return l.attempts
}

// OK records a successful attempt. It ends a run of failures, logging so
// at INFO with how long the run lasted and how many attempts failed, and
// reports whether it did.
func (l *Log) OK() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since.IsZero() {
		return false
	}
	l.log.Info(l.works, "after", l.now().Sub(l.since).Round(time.Millisecond), "failed_attempts", l.attempts)
	l.since, l.warned, l.attempts = time.Time{}, time.Time{}, 0
	return true
}

// Failing reports whether a run of failures is in progress.
func (l *Log) Failing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.since.IsZero()
}

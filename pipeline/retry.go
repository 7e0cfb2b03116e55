package pipeline

import (
	"math/rand/v2"
	"time"
)

// Retry is the backoff policy for failed publishes: exponential from Initial,
// capped at Max, with full jitter.
type Retry struct {
	// Initial is the first backoff. Default 100ms.
	Initial time.Duration
	// Max caps the backoff. Default 30s.
	Max time.Duration
	// MaxAttempts is how many failed attempts dead-letter an event.
	// Default 10.
	MaxAttempts int
}

func (r *Retry) setDefaults() {
	if r.Initial <= 0 {
		r.Initial = 100 * time.Millisecond
	}
	if r.Max <= 0 {
		r.Max = 30 * time.Second
	}
	if r.Max < r.Initial {
		r.Max = r.Initial
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = 10
	}
}

// ceiling returns the backoff ceiling after n failures (n ≥ 1), at most limit.
func (r Retry) ceiling(n int, limit time.Duration) time.Duration {
	d := r.Initial
	for i := 1; i < n && d < limit; i++ {
		if d > limit/2 {
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// delay returns the full-jitter backoff after an event's n-th failed attempt:
// a uniform random duration in [0, min(Max, Initial·2^(n-1))].
func (r Retry) delay(n int) time.Duration {
	return rand.N(r.ceiling(n, r.Max) + 1)
}

// unavailableDelay returns the wait after n consecutive failures to reach the
// sink or the database. It is capped at one second (or Max when smaller) so
// the relay resumes promptly when the broker returns, and it is jittered
// between half and all of the ceiling so it never spins.
func (r Retry) unavailableDelay(n int) time.Duration {
	c := r.ceiling(n, min(r.Max, time.Second))
	return c/2 + rand.N(c/2+1)
}

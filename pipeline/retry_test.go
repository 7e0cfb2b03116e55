package pipeline

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// bound is the documented ceiling of the backoff after the n-th failure,
// min(limit, initial·2^(n-1)), worked out in floating point: doubling a
// float is exact, and the product is converted back only below limit.
func bound(initial, limit time.Duration, n int) time.Duration {
	v := float64(initial) * math.Pow(2, float64(n-1))
	if v >= float64(limit) {
		return limit
	}
	return time.Duration(v)
}

// TestRetryBoundGrowsAndCaps pins bound to the documented default backoff:
// 100ms, doubling per failure, capped at 30s.
func TestRetryBoundGrowsAndCaps(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		5: 1600 * time.Millisecond, 9: 25600 * time.Millisecond, 10: 30 * time.Second, 11: 30 * time.Second, 1000: 30 * time.Second} {
		if got := bound(100*time.Millisecond, 30*time.Second, n); got != want {
			t.Errorf("bound after failure %d = %s, want %s", n, got, want)
		}
	}
}

// call runs f and turns a panic into an error.
func call(f func() time.Duration) (d time.Duration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f(), nil
}

var retryCases = []Retry{
	{Initial: 100 * time.Millisecond, Max: 30 * time.Second},
	{Initial: time.Millisecond, Max: 5 * time.Millisecond},
	{Initial: 7 * time.Millisecond, Max: 7 * time.Millisecond},
	{Initial: 3, Max: 1000},
	{Initial: 250 * time.Millisecond, Max: 10 * time.Minute},
	{Initial: 2 * time.Second, Max: time.Hour},
}

// 10. delay(n) is uniform in [0, min(Max, Initial·2^(n-1))]: its samples
// stay within that range and cover it, so the backoff grows by doubling
// from Initial up to Max, with full jitter.
func TestRetryDelayBounds(t *testing.T) {
	for _, r := range retryCases {
		r.setDefaults()
		for n := 1; n <= 70; n++ {
			ceil := bound(r.Initial, r.Max, n)
			lo, hi := time.Duration(math.MaxInt64), time.Duration(-1)
			for range 300 {
				d, err := call(func() time.Duration { return r.delay(n) })
				if err != nil {
					t.Fatalf("%+v: delay(%d): %v", r, n, err)
				}
				if d < 0 || d > ceil {
					t.Fatalf("%+v: delay(%d) = %s, want within [0, %s]", r, n, d, ceil)
				}
				lo, hi = min(lo, d), max(hi, d)
			}
			// Full jitter: 300 samples of a uniform draw cover the range.
			if ceil >= 1000 && (lo > ceil/4 || hi < ceil*3/4) {
				t.Errorf("%+v: delay(%d) samples span [%s, %s] of [0, %s]; want full jitter", r, n, lo, hi, ceil)
			}
		}
	}
}

// 10. unavailableDelay(n) is in [c/2, c] with c = min(Max, 1s, Initial·2^(n-1)).
func TestRetryUnavailableDelayBounds(t *testing.T) {
	for _, r := range retryCases {
		r.setDefaults()
		limit := min(r.Max, time.Second)
		for _, n := range []int{1, 2, 3, 4, 5, 8, 10, 11, 20, 64, 100, 1000} {
			c := bound(r.Initial, limit, n)
			lo, hi := time.Duration(math.MaxInt64), time.Duration(-1)
			for range 300 {
				d, err := call(func() time.Duration { return r.unavailableDelay(n) })
				if err != nil {
					t.Fatalf("%+v: unavailableDelay(%d): %v", r, n, err)
				}
				if d < c/2 || d > c {
					t.Fatalf("%+v: unavailableDelay(%d) = %s, want within [%s, %s]", r, n, d, c/2, c)
				}
				lo, hi = min(lo, d), max(hi, d)
			}
			if c >= 1000 && (lo > c*5/8 || hi < c*7/8) {
				t.Errorf("%+v: unavailableDelay(%d) samples span [%s, %s] of [%s, %s]; want jitter", r, n, lo, hi, c/2, c)
			}
		}
	}
}

// retry.max has no upper bound in the config (only max ≥ initial), so a
// long Max must not overflow the doubling: with Max above ~1281h (MaxInt64/2
// ns) Initial·2^k wraps negative before reaching Max and rand.N panics.
func TestRetryDelayHugeMax(t *testing.T) {
	r := Retry{Initial: 100 * time.Millisecond, Max: 2_000_000 * time.Hour, MaxAttempts: 100}
	r.setDefaults()
	for n := 1; n < r.MaxAttempts; n++ {
		ceil := bound(r.Initial, r.Max, n)
		for range 20 {
			d, err := call(func() time.Duration { return r.delay(n) })
			if err != nil {
				t.Fatalf("Retry{Initial: 100ms, Max: 2000000h}.delay(%d): %v (retry.go ceiling: d *= 2 overflows)", n, err)
			}
			if d < 0 || d > ceil {
				t.Fatalf("delay(%d) = %d, want within [0, %d]", n, d, ceil)
			}
		}
	}
}

func TestRetryDefaults(t *testing.T) {
	var r Retry
	r.setDefaults()
	if r != (Retry{Initial: 100 * time.Millisecond, Max: 30 * time.Second, MaxAttempts: 10}) {
		t.Errorf("defaults = %+v", r)
	}
	r = Retry{Initial: time.Second, Max: time.Millisecond, MaxAttempts: 3}
	r.setDefaults()
	if r.Max != time.Second || r.MaxAttempts != 3 {
		t.Errorf("Max below Initial: got %+v, want Max raised to Initial", r)
	}
	var o Options
	o.setDefaults()
	if o.Logger == nil || o.MaxInFlight != 10000 || o.BatchSize != 500 || o.Concurrency != 8 || o.ShutdownTimeout != 15*time.Second {
		t.Errorf("option defaults = %+v", o)
	}
}

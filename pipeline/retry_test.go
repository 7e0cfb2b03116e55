package pipeline

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// wantCeiling is min(limit, initial·2^(n-1)) computed without overflow.
func wantCeiling(initial, limit time.Duration, n int) time.Duration {
	v := initial
	for i := 1; i < n; i++ {
		if v > limit/2 {
			return limit
		}
		v *= 2
	}
	return min(v, limit)
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

// 10. delay(n) is uniform in [0, min(Max, Initial·2^(n-1))].
func TestRetryDelayBounds(t *testing.T) {
	for _, r := range retryCases {
		r.setDefaults()
		for n := 1; n <= 70; n++ {
			ceil := wantCeiling(r.Initial, r.Max, n)
			if got := r.ceiling(n, r.Max); got != ceil {
				t.Errorf("%+v: ceiling(%d) = %s, want %s", r, n, got, ceil)
			}
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
			c := wantCeiling(r.Initial, limit, n)
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
		if c := wantCeiling(r.Initial, limit, 1000); c != limit || c > time.Second {
			t.Errorf("%+v: unavailable ceiling %s, want capped at %s", r, c, limit)
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
		ceil := wantCeiling(r.Initial, r.Max, n)
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

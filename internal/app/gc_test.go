package app

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneGC: without GOGC and GOMEMLIMIT in the environment TuneGC sets
// GOGC=200 and the 64 MiB soft limit; with either set it leaves both alone.
func TestTuneGC(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	TuneGC()
	if p, l := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64); p != 200 || l != 64<<20 {
		t.Errorf("GOGC %d, limit %d; want 200 and %d", p, l, 64<<20)
	}
	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Setenv(env, "150")
		TuneGC()
		if p, l := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64); p != 100 || l != math.MaxInt64 {
			t.Errorf("with %s set: GOGC %d, limit %d; want them unchanged", env, p, l)
		}
		t.Setenv(env, "")
	}
}

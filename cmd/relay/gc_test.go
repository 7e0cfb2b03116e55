package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestGCDefaults: with neither GOGC nor GOMEMLIMIT in its environment,
// `relay run` collects garbage at GOGC=200 with a 64 MiB soft memory limit,
// which keeps a 1,000,000-event drain within 100 MB of resident memory
// (docs/benchmarks.md); the Go collector's gauges show both.
func TestGCDefaults(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	defer relay.stop(t, 15*time.Second)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	if v := scrapeCounter(addr, "go_gc_gomemlimit_bytes"); v != 64<<20 {
		t.Errorf("go_gc_gomemlimit_bytes %v, want %d", v, 64<<20)
	}
	if v := scrapeCounter(addr, "go_gc_gogc_percent"); v != 200 {
		t.Errorf("go_gc_gogc_percent %v, want 200", v)
	}
}

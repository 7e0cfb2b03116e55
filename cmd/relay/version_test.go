package main

import (
	"regexp"
	"runtime"
	"testing"
)

// TestVersion checks that relay version prints the version, the commit and
// the Go version and exits 0.
func TestVersion(t *testing.T) {
	out, code := runRelay(t, "version")
	if code != 0 {
		t.Fatalf("relay version: exit %d, want 0\n%s", code, out)
	}
	want := regexp.MustCompile(`^relay \S+\ncommit \S+\ngo ` + regexp.QuoteMeta(runtime.Version()) + `\n$`)
	if !want.MatchString(out) {
		t.Errorf("relay version printed %q, want it to match %s", out, want)
	}
}

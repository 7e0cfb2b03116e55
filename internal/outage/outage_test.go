package outage

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRunOfFailures fails an operation once a second for ten minutes: the
// log holds the first failure, one summary a minute and one line when it
// works again, and the next failure starts a new run.
func TestRunOfFailures(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "cannot connect; retrying", "connected again")
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	if l.OK() || l.Failing() {
		t.Fatal("OK before any failure ended a run")
	}
	for i := 1; i <= 600; i++ {
		if n := l.Fail(errors.New("connection refused"), "table", "t"); n != i {
			t.Fatalf("attempt %d: Fail returned %d", i, n)
		}
		now = now.Add(time.Second)
	}
	if !l.Failing() || !l.OK() || l.Failing() {
		t.Fatal("OK did not end the run")
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 11 {
		t.Fatalf("%d lines, want 11 (first failure, 9 summaries, recovery):\n%s", len(lines), buf.String())
	}
	for _, want := range []string{`level=WARN msg="cannot connect; retrying" err="connection refused" table=t`} {
		if !strings.HasPrefix(lines[0], "time=") || !strings.Contains(lines[0], want) {
			t.Errorf("first line %q lacks %q", lines[0], want)
		}
	}
	if want := `level=WARN msg="still failing: cannot connect; retrying" err="connection refused" table=t attempts=61 failing_for=1m0s`; !strings.Contains(lines[1], want) {
		t.Errorf("second line %q lacks %q", lines[1], want)
	}
	if want := `level=INFO msg="connected again" after=10m0s failed_attempts=600`; !strings.Contains(lines[10], want) {
		t.Errorf("last line %q lacks %q", lines[10], want)
	}
	buf.Reset()
	if l.Fail(errors.New("again")) != 1 || !strings.Contains(buf.String(), `level=WARN msg="cannot connect; retrying" err=again`) {
		t.Errorf("a failure after OK did not start a new run: %s", buf.String())
	}
}

package demo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// isolateTemp points TMPDIR at a new directory that user postgres can
// enter, so the test can see what the demo leaves on disk, and returns it.
func isolateTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "demo-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", dir)
	return dir
}

// assertEmpty fails the test when dir holds anything.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left behind in the temporary directory: %s", e.Name())
	}
}

func TestRunVerifiesEveryEvent(t *testing.T) {
	tmp := isolateTemp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := Run(ctx, Options{Out: &out, Events: 2000, Aggregates: 100, Producers: 4})
	t.Logf("output:\n%s", strings.ReplaceAll(out.String(), "\r", "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"demo: 2000 events over 100 aggregates", "all received",
		"per-aggregate order held", "outbox empty"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	assertEmpty(t, tmp)
}

// cancelOn passes what is written to buf and calls cancel once buf contains
// s.
type cancelOn struct {
	buf    bytes.Buffer
	s      string
	cancel context.CancelFunc
}

// Write records p and cancels when the output so far contains w.s.
func (w *cancelOn) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if w.s != "" && strings.Contains(w.buf.String(), w.s) {
		w.cancel()
	}
	return len(p), nil
}

func TestRunCleansUpWhenCancelled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cancelOn string        // cancel once the output contains this
		after    time.Duration // or after this long
	}{
		{name: "during initdb", after: 200 * time.Millisecond},
		{name: "while streaming", cancelOn: "written "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := isolateTemp(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.after > 0 {
				time.AfterFunc(tc.after, cancel)
			}
			out := &cancelOn{s: tc.cancelOn, cancel: cancel}
			begin := time.Now()
			err := Run(ctx, Options{Out: out, Events: 200000})
			t.Logf("returned after %v; output:\n%s", time.Since(begin), out.buf.String())
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run returned %v, want context.Canceled", err)
			}
			if !strings.Contains(out.buf.String(), "demo: interrupted") {
				t.Error("output does not say the demo was interrupted")
			}
			assertEmpty(t, tmp)
		})
	}
}

package progress

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestLine(t *testing.T) {
	for _, c := range []struct {
		stage       string
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{"", 0, 100, 0, "redrive: 0/100 dead letters (0%)"},
		{"", 25, 100, 5 * time.Second, "redrive: 25/100 dead letters (25%), 5 dead letters/s, ETA 15s"},
		{"", 100, 100, 5 * time.Second, "redrive: 100/100 dead letters (100%), 20 dead letters/s"},
		{"scan", 7, 0, 2 * time.Second, "redrive: scan 7 dead letters, 4 dead letters/s"},
	} {
		if got := Line("redrive", c.stage, c.done, c.total, "dead letters", c.elapsed); got != c.want {
			t.Errorf("Line(%q, %d, %d, %v) = %q, want %q", c.stage, c.done, c.total, c.elapsed, got, c.want)
		}
	}
}

// TestPlainLines checks the output that is not a terminal: one line per
// update with Always; with an interval, the first update of each stage
// and then nothing until the interval passed; Finish always.
func TestPlainLines(t *testing.T) {
	var b bytes.Buffer
	r := New(&b, "redrive", Always)
	r.Update("", 1, 3, "rows")
	r.Update("", 2, 3, "rows")
	r.Finish("3/3 rows done")
	if want := "redrive: 1/3 rows (33%)\nredrive: 2/3 rows (66%)\nredrive: 3/3 rows done\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	b.Reset()
	r = New(&b, "index", time.Hour)
	r.Update("scan", 1, 10, "blocks")
	r.Update("scan", 2, 10, "blocks")
	r.Note("wait", "pid 7")
	r.Note("wait", "pid 8")
	r.Finish("built")
	if want := "index: scan 1/10 blocks (10%)\nindex: wait: pid 7\nindex: built\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}

// TestTerminalLine checks a terminal's output: each line redraws the last
// one in place (blanking what is left of a longer one) and Finish ends it.
func TestTerminalLine(t *testing.T) {
	var b bytes.Buffer
	r := &Reporter{w: &b, what: "redrive", tty: true, every: Always}
	r.Update("", 10, 100, "rows")
	r.Update("", 100, 100, "rows")
	r.Finish("done")
	r.Stop()
	got := b.String()
	if !strings.HasPrefix(got, "\rredrive: 10/100 rows (10%)\rredrive: 100/100 rows (100%)\rredrive: done ") || !strings.HasSuffix(got, "\n") ||
		strings.Count(got, "\n") != 1 {
		t.Fatalf("got %q", got)
	}
	// An operation that fails ends its line before the error is printed.
	b.Reset()
	r.Update("", 1, 100, "rows")
	r.Stop()
	r.Stop()
	if got := b.String(); got != "\rredrive: 1/100 rows (1%)\n" {
		t.Fatalf("after Stop: %q", got)
	}
}

// TestIsTerminal: a buffer, a pipe and a regular file are not terminals.
func TestIsTerminal(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	f, err := os.Create(t.TempDir() + "/log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, w := range []io.Writer{&bytes.Buffer{}, pw, f} {
		if New(w, "x", 0).tty {
			t.Errorf("%T counted as a terminal", w)
		}
	}
}

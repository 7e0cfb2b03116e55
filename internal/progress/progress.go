// Package progress prints the progress of long operator commands (relay
// init building an index, relay dlq redrive): count, rate and ETA. On a
// terminal it redraws one line in place; elsewhere (a log file, a CI job,
// kubectl logs) it prints a plain line at most every Every, so logs stay
// readable.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// DefaultEvery is Reporter.Every's default when the output is not a
// terminal.
const DefaultEvery = 5 * time.Second

// terminalEvery is how often a terminal's line is redrawn, at most.
const terminalEvery = 200 * time.Millisecond

// Reporter reports the progress of one operation to a writer. Its methods
// are safe for concurrent use.
type Reporter struct {
	w     io.Writer
	what  string // e.g. "redrive"
	tty   bool
	every time.Duration

	mu        sync.Mutex
	stage     string // the current stage, e.g. a phase of an index build
	unit      string
	start     time.Time // of the stage
	printed   time.Time // the last line's time; zero before the first
	dirty     bool      // a terminal line is drawn and not yet ended
	lastWidth int
}

// New returns a Reporter printing to w lines that start with what. When w
// is a terminal (a character device), it redraws one line in place at most
// every 200 ms; otherwise it prints a line at most every every
// (DefaultEvery when zero; Always prints one on each update). A new stage
// is always printed.
func New(w io.Writer, what string, every time.Duration) *Reporter {
	tty := isTerminal(w)
	switch {
	case tty:
		every = terminalEvery
	case every == Always:
	case every <= 0:
		every = DefaultEvery
	}
	return &Reporter{w: w, what: what, tty: tty, every: every}
}

// Always, as New's every, prints a line on every update (tests).
const Always = time.Duration(-1)

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Update reports done of total units (e.g. "dead letters", "blocks") in
// stage (may be empty); total 0 means unknown. A new stage restarts the
// rate and ETA and is always printed; otherwise a line is printed when the
// last one is older than the interval.
func (r *Reporter) Update(stage string, done, total int64, unit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	newStage := stage != r.stage || unit != r.unit || r.start.IsZero()
	if newStage {
		r.stage, r.unit, r.start = stage, unit, now
	}
	if !newStage && r.every != Always && now.Sub(r.printed) < r.every {
		return
	}
	r.printed = now
	r.emit(Line(r.what, stage, done, total, unit, now.Sub(r.start)))
}

// Note prints a message line (a stage without counts, e.g. a wait naming
// what is waited for) under the same interval rules as Update.
func (r *Reporter) Note(stage, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	newStage := stage != r.stage || r.unit != "" || r.start.IsZero()
	if newStage {
		r.stage, r.unit, r.start = stage, "", now
	}
	if !newStage && r.every != Always && now.Sub(r.printed) < r.every {
		return
	}
	r.printed = now
	line := r.what + ": " + stage
	if msg != "" {
		line += ": " + msg
	}
	r.emit(line)
}

// Finish prints the final line, msg, always, ending a terminal's line.
func (r *Reporter) Finish(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emit(r.what + ": " + msg)
	r.endLine()
}

// Stop ends a terminal's line that Finish did not, so that what is
// printed next (an error) starts on a line of its own.
func (r *Reporter) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endLine()
}

// endLine ends a terminal's line being redrawn; r.mu is held.
func (r *Reporter) endLine() {
	if r.dirty {
		fmt.Fprintln(r.w)
		r.dirty, r.lastWidth = false, 0
	}
}

// emit writes line: on a terminal over the previous one, else on its own.
func (r *Reporter) emit(line string) {
	if !r.tty {
		fmt.Fprintln(r.w, line)
		return
	}
	pad := r.lastWidth - len(line)
	r.lastWidth = len(line)
	if pad < 0 {
		pad = 0
	}
	fmt.Fprintf(r.w, "\r%s%*s", line, pad, "")
	r.dirty = true
}

// Line formats one progress line: "what: stage done/total unit (pct%),
// rate unit/s, ETA eta" after elapsed in the stage; parts that are unknown
// (no total, no rate yet) are left out.
func Line(what, stage string, done, total int64, unit string, elapsed time.Duration) string {
	s := what + ": "
	if stage != "" {
		s += stage + " "
	}
	if total > 0 {
		s += fmt.Sprintf("%d/%d %s (%d%%)", done, total, unit, done*100/total)
	} else {
		s += fmt.Sprintf("%d %s", done, unit)
	}
	if elapsed < time.Second/10 || done <= 0 {
		return s
	}
	rate := float64(done) / elapsed.Seconds()
	s += fmt.Sprintf(", %.0f %s/s", rate, unit)
	if total > done {
		eta := time.Duration(float64(total-done) / rate * float64(time.Second))
		s += ", ETA " + eta.Round(time.Second).String()
	}
	return s
}

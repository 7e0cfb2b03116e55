package demo

import (
	"fmt"
	"io"
	"strconv"
	"time"
)

// progress is the one status line the demo rewrites while events flow.
type progress struct {
	out     io.Writer
	total   int
	samples []sample // consumed counts of about the last second, oldest first
	shown   bool
}

// newProgress returns the line for total events, none consumed yet.
func newProgress(out io.Writer, total int) *progress {
	return &progress{out: out, total: total, samples: []sample{{at: time.Now()}}}
}

// sample is the consumed count at one moment.
type sample struct {
	at time.Time
	n  int64
}

// show rewrites the line with the current counts and the rate at which
// events were consumed over about the last second.
func (p *progress) show(written, published, consumed int64) {
	line := fmt.Sprintf("written %d/%d  published %d  consumed %d  %s ev/s  lag %d",
		written, p.total, published, consumed, thousands(p.rate(consumed)), written-consumed)
	fmt.Fprintf(p.out, "\r%-78s", line)
	p.shown = true
}

// end finishes the line, if one was shown.
func (p *progress) end() {
	if p.shown {
		fmt.Fprintln(p.out)
	}
}

// rate records that n events were consumed by now and returns the events
// per second since the newest sample at least a second old.
func (p *progress) rate(n int64) int64 {
	now := time.Now()
	p.samples = append(p.samples, sample{now, n})
	for len(p.samples) > 2 && now.Sub(p.samples[1].at) >= time.Second {
		p.samples = p.samples[1:]
	}
	first := p.samples[0]
	secs := now.Sub(first.at).Seconds()
	if secs <= 0 {
		return 0
	}
	return int64(float64(n-first.n) / secs)
}

// thousands formats a non-negative n with commas between groups of three
// digits: 12,345.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// RSSResult is one large drain (-rss) measuring the relay's memory: its
// peak resident set, and what the Go runtime held meanwhile.
type RSSResult struct {
	Mode   string      `json:"mode"`
	Events int         `json:"events"`
	Drain  DrainResult `json:"drain"`
	// PeakRSSMB is the relay process's VmHWM after the drain.
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// The largest values of the relay's go_memstats gauges, sampled every
	// 250 ms: the heap in use, and all memory the Go runtime obtained from
	// the OS (heap, stacks, runtime structures). What VmHWM holds beyond
	// that is the binary's text and data.
	MaxHeapInuseMB float64 `json:"max_go_heap_inuse_mb"`
	MaxGoSysMB     float64 `json:"max_go_sys_mb"`
	Samples        int     `json:"samples"`
}

// rssEventsDefault is the backlog of the -rss drains.
const rssEventsDefault = 1_000_000

// rssLimitMB is the peak RSS target of a 1,000,000-event drain.
const rssLimitMB = 100

// measureRSS drains o.RSSEvents events into NATS in each mode, with the
// relay as a child process, and records its peak RSS and Go memory.
func (e *env) measureRSS(ctx context.Context, dbs map[string]*database, modes []string) ([]RSSResult, error) {
	var out []RSSResult
	sub := *e
	sub.opts.Events = e.opts.RSSEvents
	for _, mode := range drainOrder(modes) {
		res := RSSResult{Mode: mode, Events: sub.opts.Events}
		var mu sync.Mutex
		var procs []*relayProc
		start := func(d *database, tag string) (*relayProc, error) {
			p, err := e.startRelay(d, tag)
			if err == nil {
				mu.Lock()
				procs = append(procs, p)
				mu.Unlock()
			}
			return p, err
		}
		done := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			t := time.NewTicker(250 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
				}
				mu.Lock()
				ps := procs
				mu.Unlock()
				for _, p := range ps {
					m, err := p.metrics()
					if err != nil {
						continue
					}
					res.Samples++
					res.MaxHeapInuseMB = max(res.MaxHeapInuseMB, m["go_memstats_heap_inuse_bytes"]/(1<<20))
					res.MaxGoSysMB = max(res.MaxGoSysMB, m["go_memstats_sys_bytes"]/(1<<20))
				}
			}
		}()
		e.opts.logf("rss: %s drain of %d events into NATS", mode, sub.opts.Events)
		dr, err := sub.measureDrain(ctx, dbs[mode], 1, start, nil)
		close(done)
		<-sampled
		res.Drain, res.PeakRSSMB = dr, dr.PeakRSSMB
		out = append(out, res)
		e.opts.logf("rss: %s: peak RSS %.0f MB, Go heap in use at most %.0f MB, Go runtime total at most %.0f MB",
			mode, res.PeakRSSMB, res.MaxHeapInuseMB, res.MaxGoSysMB)
		if err != nil {
			return out, fmt.Errorf("rss %s drain: %w", mode, err)
		}
	}
	return out, nil
}

// printRSS prints the -rss drains.
func printRSS(w io.Writer, r *Results) {
	if len(r.RSS) == 0 {
		return
	}
	t := newTable(w, "PEAK RSS (drain into NATS)", "events", "events/s", "seconds", "peak RSS MB", "Go heap in use MB", "Go runtime MB", "limit MB")
	for _, x := range r.RSS {
		name := x.Mode
		if !x.Drain.Complete {
			name += " (INCOMPLETE)"
		}
		t.row(name, thousands(int64(x.Events)), f0(x.Drain.Drain.PerSecond), f1(x.Drain.Drain.Seconds), f0(x.PeakRSSMB),
			f0(x.MaxHeapInuseMB), f0(x.MaxGoSysMB), fmt.Sprint(rssLimitMB))
	}
	t.flush()
}

// rssTargets checks the peak RSS of a 1,000,000-event drain per mode: the
// -rss drains, else a NATS drain of the main phase that large.
func rssTargets(r *Results) []Target {
	var out []Target
	for _, mode := range []string{"wal", "poll"} {
		tg := Target{Name: mode + " peak RSS", Goal: fmt.Sprintf("peak RSS ≤ %d MB draining %s events", rssLimitMB, thousands(rssEventsDefault)),
			Measured: "-", Status: "not measured (run with -rss)"}
		for _, x := range r.RSS {
			if x.Mode == mode && x.Events >= rssEventsDefault {
				tg.Measured = fmt.Sprintf("%.0f MB (%s events)", x.PeakRSSMB, thousands(int64(x.Events)))
				tg.Status = met(x.PeakRSSMB <= rssLimitMB && x.Drain.Complete)
			}
		}
		for _, d := range r.Drains {
			if tg.Measured == "-" && d.Mode == mode && d.Sink == "nats" && d.Drain.Events >= rssEventsDefault {
				tg.Measured = fmt.Sprintf("%.0f MB (the main drain)", d.PeakRSSMB)
				tg.Status = met(d.PeakRSSMB <= rssLimitMB && d.Complete)
			}
		}
		if _, ok := r.Unavailable[mode]; ok {
			tg.Status = "not available yet"
		}
		out = append(out, tg)
	}
	return out
}

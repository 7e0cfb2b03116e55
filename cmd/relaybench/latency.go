package main

import (
	"fmt"
	"io"
	"time"
)

// steadyLoad is one open-loop rate of the steady state: percent of the
// commit rate, or 0 for a fixed rate.
type steadyLoad struct {
	percent int
	rate    float64
}

// fixedLoadRate is the fixed commit rate (per second) poll mode's latency
// target is set at; both modes run it, first.
const fixedLoadRate = 2000

// steadyLoads returns the steady state's rates in the order they run: the
// fixed rate, then steadyPercents of commitRate.
func steadyLoads(commitRate float64) []steadyLoad {
	out := []steadyLoad{{0, fixedLoadRate}}
	for _, p := range steadyPercents {
		out = append(out, steadyLoad{p, commitRate * float64(p) / 100})
	}
	return out
}

// label names a steady-state rate: "wal 25%" or "poll 2000/s".
func (s SteadyResult) label() string {
	if s.Percent == 0 {
		return fmt.Sprintf("%s %.0f/s", s.Mode, s.TargetRate)
	}
	return fmt.Sprintf("%s %d%%", s.Mode, s.Percent)
}

// decoderLatency returns the latencies from each event's commit, as its
// writer saw it, to its receipt by the decodeReader. The reader may receive
// an event a little before its writer sees the commit return: such events
// count as 0.
func decoderLatency(s *schedule) Percentiles {
	var h histogram
	for i := range s.n {
		if c, rd := s.commitAt[i].Load(), s.readAt[i].Load(); c > 0 && rd > 0 {
			h.record(time.Duration(rd - c))
		}
	}
	return h.summary()
}

// walLatencyLimit is wal mode's latency target: the relay's p99 from
// commit to receipt at most 1.5 times the pgoutput reader's plus 5 ms.
func walLatencyLimit(readerP99 float64) float64 { return 1.5*readerP99 + 5 }

// pollLatencyLimit is poll mode's p99 target (ms) at fixedLoadRate.
const pollLatencyLimit = 30.0

// printLatency prints the relay's commit→receipt latency beside the
// pgoutput reader's in the same run, at every steady-state rate.
func printLatency(w io.Writer, r *Results) {
	if len(r.Steady) == 0 {
		return
	}
	t := newTable(w, "LATENCY commit→receipt (ms)", "offered/s", "committed/s", "relay p50", "p99", "max",
		"pgoutput reader p50", "p99", "max", "p99 ratio", "p99 limit", "relay CPU %", "machine busy")
	for _, st := range r.Steady {
		committed := f0(st.AchievedRate)
		if st.Saturated {
			committed += " (saturated)"
		}
		rel, dec := st.CommitToRecv, st.Decoder
		ratio, limit := "", ""
		if dec.Count > 0 && dec.P99 > 0 {
			ratio = fmt.Sprintf("%.2f×", rel.P99/dec.P99)
		}
		switch {
		case st.Mode == "wal" && st.Percent > 0 && st.Percent <= 50 && dec.Count > 0:
			limit = f1(walLatencyLimit(dec.P99))
		case st.Mode == "poll" && st.Percent == 0:
			limit = f1(pollLatencyLimit)
		}
		t.row(st.label(), f0(st.TargetRate), committed, f1(rel.P50), f1(rel.P99), f1(rel.Max),
			f1(dec.P50), f1(dec.P99), f1(dec.Max), ratio, limit,
			f0(100*st.RelayCPU/max(st.CPU.Seconds, 1e-9)), f0(st.CPU.MachineBusyPercent)+"%")
	}
	t.flush()
}

// latencyTargets checks wal mode's p99 against the pgoutput reader's at 25
// and 50 % of the commit rate, and poll mode's at fixedLoadRate.
func latencyTargets(r *Results) []Target {
	find := func(mode string, pct int) *SteadyResult {
		for i := range r.Steady {
			if r.Steady[i].Mode == mode && r.Steady[i].Percent == pct {
				return &r.Steady[i]
			}
		}
		return nil
	}
	status := func(s *SteadyResult, ok bool) string {
		switch {
		case s.Saturated:
			return fmt.Sprintf("not measured: the database committed only %.0f of %.0f offered/s", s.AchievedRate, s.TargetRate)
		case s.CommitToRecv.Count != s.Committed || s.Committed == 0:
			return "not met: events missing"
		}
		return met(ok)
	}
	var out []Target
	for _, pct := range []int{25, 50} {
		tg := Target{Name: fmt.Sprintf("wal p99 at %d %%", pct),
			Goal:     fmt.Sprintf("p99 commit→receipt ≤ 1.5 × the pgoutput reader's p99 + 5 ms, same run, %d %% of the commit rate", pct),
			Measured: "-", Status: "not measured"}
		if s := find("wal", pct); s != nil && s.Decoder.Count > 0 {
			lim := walLatencyLimit(s.Decoder.P99)
			tg.Measured = fmt.Sprintf("%.1f ms; reader %.1f ms, limit %.1f ms", s.CommitToRecv.P99, s.Decoder.P99, lim)
			tg.Status = status(s, s.CommitToRecv.P99 <= lim)
		} else if _, ok := r.Unavailable["wal"]; ok {
			tg.Status = "not available yet"
		}
		out = append(out, tg)
	}
	tg := Target{Name: fmt.Sprintf("poll p99 at %d/s", fixedLoadRate),
		Goal:     fmt.Sprintf("p99 commit→receipt ≤ %.0f ms at %d commits/s", pollLatencyLimit, fixedLoadRate),
		Measured: "-", Status: "not measured"}
	if s := find("poll", 0); s != nil {
		tg.Measured = fmt.Sprintf("%.1f ms (p50 %.1f ms; the pgoutput reader: p99 %.1f ms)", s.CommitToRecv.P99, s.CommitToRecv.P50, s.Decoder.P99)
		tg.Status = status(s, s.CommitToRecv.P99 <= pollLatencyLimit)
	}
	return append(out, tg)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

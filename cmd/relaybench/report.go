package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// printTable prints the results as one table with three parts: drains
// and baselines, steady state, targets.
func printTable(w io.Writer, r *Results) {
	printHeader(w, r)
	printDrains(w, r)
	printCPUTable(w, r)
	printSteady(w, r)
	printLatency(w, r)
	printRSS(w, r)
	printScaling(w, r)
	printImpact(w, r)
	printInsert(w, r)
	printTargets(w, r)
	if r.Error != "" {
		fmt.Fprintf(w, "\nINCOMPLETE: %s\n", firstLine(r.Error))
	}
}

// printHeader prints the run's settings, machine and background load.
func printHeader(w io.Writer, r *Results) {
	s := r.Settings
	fmt.Fprintf(w, "\nrelaybench: %s events, %s aggregates, %d-byte payloads; %d CPUs (%s), %d MB; PostgreSQL %s; wall time %s\n",
		thousands(int64(s.Events)), thousands(int64(s.Aggregates)), s.PayloadBytes, r.Machine.CPUs, r.Machine.CPUModel,
		r.Machine.MemoryMB, r.Machine.Postgres, (time.Duration(r.WallSeconds * float64(time.Second))).Round(time.Second))
	fmt.Fprintf(w, "command: %s\n", r.Command)
	fmt.Fprintf(w, "background load before the run: %.0f%% busy; \"other CPU\" is CPU time of processes that are neither Postgres, the relay nor this bench (which runs NATS)\n\n",
		r.Background.MachineBusyPercent)
}

// printDrains prints the drains, the baselines and the single-row commit
// rates.
func printDrains(w io.Writer, r *Results) {
	t := newTable(w, "BACKLOG DRAIN", "events/s", "seconds", "ratio", "peak RSS MB", "relay CPU s", "CPU s/100k",
		"postgres CPU s", "bench+NATS CPU s", "other CPU s", "machine busy")
	for _, d := range r.Drains {
		drainRow(t, fmt.Sprintf("%s → %s (%d relay)", d.Mode, sinkLabel(d.Sink), d.Relays), d)
	}
	for _, p := range r.Profiles {
		drainRow(t, p.Mode+" → NATS JetStream, profiled", p)
	}
	for _, k := range sortedKeys(r.Unavailable) {
		mode, snk, _ := strings.Cut(k, "+")
		if snk == "" {
			snk = "nats"
		}
		t.row(mode+" → "+sinkLabel(snk), "not available yet")
	}
	for _, k := range []string{"pgoutput", "delete"} {
		if b, ok := r.Baselines[k]; ok {
			t.row("baseline: "+b.Name, f0(b.PerSecond), f1(b.Seconds), "1.00×", "", "", "",
				f1(b.CPU.PostgresSeconds), f1(b.CPU.BenchSeconds), f1(b.CPU.OtherSeconds), f0(b.CPU.MachineBusyPercent)+"%")
		}
	}
	if c := r.CommitRate; c != nil {
		t.row("", "")
		t.row("SINGLE-ROW COMMITS", "commits/s", "seconds", "writers", "p50 ms", "p99 ms")
		t.row("plain outbox (the rate the loads are % of)", f0(c.PerSecond), f1(c.Seconds), fmt.Sprint(c.Writers), f2(c.Latency.P50), f2(c.Latency.P99))
		if n := r.NotifyCommitRate; n != nil {
			t.row("with a NOTIFY trigger (poll.notify)", f0(n.PerSecond), f1(n.Seconds), fmt.Sprint(n.Writers), f2(n.Latency.P50), f2(n.Latency.P99))
		}
	}
	t.flush()
}

// printSteady prints the steady-state rates.
func printSteady(w io.Writer, r *Results) {
	if len(r.Steady) == 0 {
		return
	}
	t := newTable(w, "STEADY STATE", "offered/s", "committed/s", "send→ack p50", "p95", "p99", "p99.9", "max ms",
		"send→receipt p99", "commit→ack p50", "p99", "lag mid", "lag end", "bounded", "relay CPU %", "other CPU %")
	for _, st := range r.Steady {
		committed := f0(st.AchievedRate)
		if st.Saturated {
			committed += " (saturated)"
		}
		t.row(st.label(), f0(st.TargetRate), committed,
			f1(st.SendToAck.P50), f1(st.SendToAck.P95), f1(st.SendToAck.P99), f1(st.SendToAck.P999), f1(st.SendToAck.Max),
			f1(st.SendToReceipt.P99), f1(st.CommitToAck.P50), f1(st.CommitToAck.P99), f0(st.LagMiddle), f0(st.LagEnd), yesNo(st.Bounded),
			f0(100*st.RelayCPU/max(st.CPU.Seconds, 1e-9)), f0(100*st.CPU.OtherSeconds/max(st.CPU.Seconds, 1e-9)))
	}
	for _, mode := range sortedKeys(r.Unavailable) {
		if !strings.Contains(mode, "+") {
			t.row(mode, "not available yet")
		}
	}
	t.flush()
}

// printScaling prints the scaling curves' points.
func printScaling(w io.Writer, r *Results) {
	if len(r.Scaling) == 0 {
		return
	}
	t := newTable(w, "SCALING (drain into NATS)", "events", "payload B", "aggregates", "relays", "events/s", "payload MB/s",
		"peak RSS MB", "CPU s/100k", "other CPU s")
	for _, p := range r.Scaling {
		name := fmt.Sprintf("%s %s=%d", p.Mode, p.Curve, p.Value)
		if !p.Complete {
			name += " (INCOMPLETE)"
		}
		t.row(name, fmt.Sprint(p.Events), fmt.Sprint(p.Payload), fmt.Sprint(p.Aggregates), fmt.Sprint(p.Relays),
			f0(p.PerSecond), f1(p.MBPerSec), f0(p.PeakRSSMB), f2(p.CPUPer100k), f1(p.CPU.OtherSeconds))
	}
	t.flush()
}

// printTargets prints each target, its goal, the figure and whether it was
// met.
func printTargets(w io.Writer, r *Results) {
	if len(r.Targets) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TARGET\tgoal\tmeasured\tstatus")
	for _, t := range r.Targets {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Goal, t.Measured, t.Status)
	}
	tw.Flush()
}

// table is a right-aligned text table whose rows all have the header's
// number of cells, so that tabwriter keeps one column block.
type table struct {
	tw   *tabwriter.Writer
	w    io.Writer
	cols int
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight), w: w, cols: len(header)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for len(cells) < t.cols {
		cells = append(cells, "")
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t")+"\t")
}

func (t *table) flush() {
	t.tw.Flush()
	fmt.Fprintln(t.w)
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

func drainRow(t *table, name string, d DrainResult) {
	ratio := ""
	if d.Ratio > 0 {
		ratio = fmt.Sprintf("%.2f×", d.Ratio)
	}
	if !d.Complete {
		name += " (INCOMPLETE)"
	}
	t.row(name, f0(d.Drain.PerSecond), f1(d.Drain.Seconds), ratio, f0(d.PeakRSSMB), f1(d.CPUSeconds), f2(d.CPUPer100k),
		f1(d.CPU.PostgresSeconds), f1(d.CPU.BenchSeconds), f1(d.CPU.OtherSeconds), f0(d.CPU.MachineBusyPercent)+"%")
}

func sinkLabel(snk string) string {
	switch snk {
	case "kafka":
		return "kfake (in-memory fake Kafka)"
	case "rabbitmq":
		return "RabbitMQ (quorum queue)"
	case "pubsub":
		return "pstest (in-process fake Pub/Sub)"
	}
	return "NATS JetStream"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func writeJSON(path string, r *Results) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestBenchSmoke runs the whole bench in its smallest configuration: every
// phase, poll mode (and wal, reported as not available until this build
// has it), so CI proves the command works end to end.
func TestBenchSmoke(t *testing.T) {
	out := filepath.Join(t.TempDir(), "results.json")
	opts := Options{
		Events: 5000, Aggregates: 500, Payload: 200, Out: out,
		Modes: []string{"poll", "wal"}, Sinks: []string{"nats", "kafka"}, Phases: []string{"drain", "baselines", "steady"},
		Steady: time.Second, CommitFor: 500 * time.Millisecond, Writers: 4, Relays: 1, RSSEvents: 3000, Consumer: true,
		RelayBin: relayBin, Args: []string{"relaybench", "(smoke test)"},
	}
	res := runBench(t, opts, 5*time.Minute)
	table := tableOf(t, res)
	if err := writeJSON(out, res); err != nil {
		t.Fatal(err)
	}

	var back Results
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("results JSON: %v", err)
	}
	var poll, kafka *DrainResult
	consumers := 0
	for i, d := range res.Drains {
		switch {
		case d.Consumer:
			consumers++
			if !d.Complete || d.ConsumerReceived != 5000 || d.AllocsPerEvent <= 0 || d.CPUPer100k <= 0 {
				t.Errorf("%s drain with a consumer: %+v", d.Mode, d)
			}
		case d.Mode == "poll" && d.Sink == "nats":
			poll = &res.Drains[i]
		case d.Mode == "poll" && d.Sink == "kafka":
			kafka = &res.Drains[i]
		}
	}
	if _, unavailable := res.Unavailable["poll+kafka"]; !unavailable &&
		(kafka == nil || !kafka.Complete || !kafka.OutboxEmpty || kafka.StreamMessages != 5000) {
		t.Errorf("poll → kfake drain: %+v", kafka)
	}
	if poll == nil || !poll.Complete || !poll.OutboxEmpty || poll.StreamMessages != 5000 || poll.Drain.PerSecond <= 0 {
		t.Errorf("poll drain: %+v", poll)
	}
	if consumers != 2 {
		t.Errorf("%d drains with a consumer, want one per mode", consumers)
	}
	if !strings.Contains(table.String(), "CPU AND ALLOCATIONS") {
		t.Errorf("no CPU and allocations table:\n%s", table.String())
	}
	if poll != nil && (poll.PeakRSSMB <= 0 || poll.CPUSeconds <= 0 || poll.Ratio <= 0 || poll.AllocsPerEvent <= 0) {
		t.Errorf("poll drain cost or ratio missing: rss %.1f MB, cpu %.2fs, ratio %.2f", poll.PeakRSSMB, poll.CPUSeconds, poll.Ratio)
	}
	for _, k := range []string{"pgoutput", "delete"} {
		if res.Baselines[k].PerSecond <= 0 {
			t.Errorf("baseline %s missing: %+v", k, res.Baselines[k])
		}
	}
	if res.CommitRate == nil || res.CommitRate.PerSecond <= 0 {
		t.Fatalf("commit rate: %+v", res.CommitRate)
	}
	steady := 0
	for _, s := range res.Steady {
		if s.Mode != "poll" {
			continue
		}
		steady++
		// A database that cannot commit the offered load drops what it did
		// not commit in time; everything committed must arrive, and every
		// scheduled event counts in the latencies.
		if s.Committed == 0 || s.Received != s.Committed || s.Committed+s.Dropped != int64(s.Scheduled) ||
			s.SendToAck.Count != int64(s.Scheduled) || s.SendToReceipt.P99 <= 0 {
			t.Errorf("steady %s: scheduled %d, committed %d, dropped %d, received %d, latencies %d",
				s.label(), s.Scheduled, s.Committed, s.Dropped, s.Received, s.SendToAck.Count)
		}
		// The pgoutput reader saw every committed event of the same run.
		if s.Decoder.Count != s.Committed || s.CommitToRecv.Count != s.Committed {
			t.Errorf("steady %s: committed %d, the reader's latencies %d, the relay's %d",
				s.label(), s.Committed, s.Decoder.Count, s.CommitToRecv.Count)
		}
	}
	if want := len(steadyLoads(1)); steady != want {
		t.Errorf("%d poll steady-state rates, want %d", steady, want)
	}
	if len(res.RSS) != len(opts.Modes)-len(res.Unavailable) {
		t.Errorf("rss drains: %+v", res.RSS)
	}
	for _, x := range res.RSS {
		if !x.Drain.Complete || x.PeakRSSMB <= 0 || x.MaxHeapInuseMB <= 0 || x.MaxGoSysMB < x.MaxHeapInuseMB {
			t.Errorf("rss %s drain: complete %v, peak RSS %.1f MB, heap %.1f MB, Go runtime %.1f MB",
				x.Mode, x.Drain.Complete, x.PeakRSSMB, x.MaxHeapInuseMB, x.MaxGoSysMB)
		}
	}
	for _, name := range []string{"LATENCY commit→receipt", "PEAK RSS"} {
		if !strings.Contains(table.String(), name) {
			t.Errorf("table has no %s part", name)
		}
	}
	if _, unavailable := res.Unavailable["wal"]; !unavailable {
		walDrained := false
		for _, d := range res.Drains {
			walDrained = walDrained || (d.Mode == "wal" && d.Complete)
		}
		if !walDrained {
			t.Errorf("wal mode is available but was not drained")
		}
	}
	cpuTargets := 0
	for _, tg := range res.Targets {
		if strings.HasSuffix(tg.Name, " CPU") {
			cpuTargets++
		}
	}
	if len(res.Targets) < 6+3*4 || cpuTargets != 4 || !strings.Contains(table.String(), "TARGET") {
		t.Errorf("targets (at least 6, and CPU, allocations and ratio for each of 4 drains into NATS): %+v", res.Targets)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 100_000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {0.999, 99900 * time.Microsecond}, {1, 100 * time.Millisecond}} {
		got := h.quantile(c.q)
		if diff := float64(got-c.want) / float64(c.want); diff > 0.01 || diff < -0.01 {
			t.Errorf("quantile %.3f = %s, want %s ±1%%", c.q, got, c.want)
		}
	}
	if s := h.summary(); s.Count != 100_000 || s.Max != 100 || s.Mean < 49.9 || s.Mean > 50.1 {
		t.Errorf("summary %+v", s)
	}
	var small histogram
	for _, v := range []time.Duration{3, 200, 255} {
		small.record(v)
	}
	if small.quantile(0) != 3 || small.quantile(0.5) != 200 || small.quantile(1) != 255 {
		t.Errorf("exact small values: %v %v %v", small.quantile(0), small.quantile(0.5), small.quantile(1))
	}
}

func TestBenchID(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, idx := range []int{0, 1, 4095, 1 << 40} {
		id := benchID(0x0abcdef1, idx, rng)
		u := uuid.UUID(id)
		if u.Version() != 4 || u.Variant() != uuid.RFC4122 {
			t.Errorf("id %s: version %d variant %v", u, u.Version(), u.Variant())
		}
		tag, got, ok := parseBenchID(u.String())
		if !ok || tag != 0x0abcdef1 || got != idx {
			t.Errorf("parse %s = %x %d %v, want %x %d", u, tag, got, ok, 0x0abcdef1, idx)
		}
	}
	if _, _, ok := parseBenchID("not-a-uuid"); ok {
		t.Error("parsed garbage")
	}
}

func TestPayloadSize(t *testing.T) {
	for _, size := range []int{100, 200, 1024, 16384} {
		p := payloadFor(123, 45, size)
		var v map[string]any
		if err := json.Unmarshal([]byte(p), &v); err != nil || len(p) != size {
			t.Errorf("payload %d: %d bytes, %v", size, len(p), err)
		}
	}
}

// TestImpactSmoke runs the impact phase for about two seconds per run: no
// relay (inserting rows, emitting messages), then per mode its floors and
// its relay, each handling every committed event, the relays with ratios
// to their floors, and a summary judging the targets.
func TestImpactSmoke(t *testing.T) {
	opts := Options{
		Events: 1000, Aggregates: 500, Payload: 200, Modes: []string{"poll", "wal"}, Sinks: []string{"nats"},
		Phases: []string{"impact"}, Relays: 1, ImpactFor: 2 * time.Second, ImpactClients: 4, ImpactSink: "nats", ImpactFloors: true,
		ImpactModes: []string{"poll", "wal", "messages", "partition"}, ImpactRounds: 1, ImpactSyncCommit: "off",
		RelayBin: relayBin, Args: []string{"relaybench", "(impact smoke test)"},
	}
	res := runBench(t, opts, 10*time.Minute)
	table := tableOf(t, res)
	want := []string{"none", noneMessages, floorPoll, floorPollPublish, "poll", floorWAL, floorWALDelete, "wal", "messages", "partition"}
	if res.Impact == nil || len(res.Impact.Runs) != len(want) || res.Impact.Pinning == "" {
		t.Fatalf("impact: %+v", res.Impact)
	}
	for i, r := range res.Impact.Runs {
		if r.Relay != want[i] || r.Transactions == 0 || r.TPS <= 0 || r.Latency.P99 <= 0 || !r.Complete || r.WALBytes <= 0 {
			t.Errorf("impact run %d (want %s): %+v", i, want[i], r)
		}
		if !noRelay(r.Relay) && (r.EventsRelayed != r.Transactions || r.relaySyscalls <= 0 || r.TPSRatio <= 0 || r.PostgresPer100k <= 0) {
			t.Errorf("impact run %s: handled %d of %d, %d syscalls, TPS ratio %.2f, postgres CPU %.2f s/100k",
				r.Relay, r.EventsRelayed, r.Transactions, r.relaySyscalls, r.TPSRatio, r.PostgresPer100k)
		}
		// Every run but the wal floor's, the table-free relay's and the
		// partition relay's removes the rows it handled.
		if deletes := r.DeletesPer100k > 0; !noRelay(r.Relay) && deletes != (r.Relay != floorWAL && !emits(r.Relay) && r.Relay != "partition") {
			t.Errorf("impact run %s: %.0f deletes/100k", r.Relay, r.DeletesPer100k)
		}
		if floor := floorOf(r.Relay); r.Floor != floor || (floor != "" && (r.TPSToFloor <= 0 || r.PostgresToFloor <= 0)) {
			t.Errorf("impact run %s: floor %q (want %q), TPS × floor %.2f, postgres CPU × floor %.2f",
				r.Relay, r.Floor, floor, r.TPSToFloor, r.PostgresToFloor)
		}
	}
	if len(res.Impact.Summary) != len(want) {
		t.Fatalf("impact summary: %+v", res.Impact.Summary)
	}
	for _, s := range res.Impact.Summary {
		if judged := s.TPSTarget != "" && s.CPUTarget != ""; judged != (s.Relay == "poll" || walRelay(s.Relay)) || (s.KeepsUp != "") != walRelay(s.Relay) {
			t.Errorf("impact summary %s: targets %q %q %q", s.Relay, s.TPSTarget, s.CPUTarget, s.KeepsUp)
		}
	}
	for _, s := range []string{"IMPACT ON THE APPLICATION", "IMPACT SUMMARY", "table-free relay (messages)", "poll floor (DELETE … RETURNING)", "poll floor + publish", "wal floor (pg_recvlogical, rows stay)", "TPS × floor"} {
		if !strings.Contains(table.String(), s) {
			t.Errorf("no %q in the impact table:\n%s", s, table.String())
		}
	}
}

// runBench runs the bench with opts for at most d and returns its results;
// a failure fails t with the bench's log.
func runBench(t *testing.T, opts Options, d time.Duration) *Results {
	t.Helper()
	var log bytes.Buffer
	opts.Log = &log
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := Run(ctx, opts)
	if err != nil {
		t.Fatalf("bench: %v\nlog:\n%s", err, log.String())
	}
	return res
}

// tableOf returns the bench's printed tables for res, and logs them.
func tableOf(t *testing.T, res *Results) *bytes.Buffer {
	t.Helper()
	var table bytes.Buffer
	printTable(&table, res)
	t.Logf("\n%s", table.String())
	return &table
}

// relayBin is cmd/relay, built once by TestMain for the bench runs of
// every test (Options.RelayBin): a build of its own per run took longer
// than most of the phases the tests run.
var relayBin string

// TestMain lets the test binary run as a profiling relay and as a floor's
// database loop: -cpuprofile re-executes the running binary with
// -as-relay, the impact phase's floors with -as-floor. Otherwise it builds
// relayBin and runs the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "-as-relay" || os.Args[1] == "-as-floor") {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	dir, err := os.MkdirTemp("", "relaybench-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e := &env{dir: dir}
	if err := e.buildRelay(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	relayBin = e.relayBin
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestImpactProfileKafka runs the impact phase's wal run into kfake with
// -cpuprofile: every committed event reaches the topics, the run counts
// kfake's produce requests, and the profiling relay writes its CPU profile
// to DIR/impact-wal.
func TestImpactProfileKafka(t *testing.T) {
	dir := t.TempDir()
	opts := Options{
		Events: 1000, Aggregates: 500, Payload: 200, Modes: []string{"wal"}, Sinks: []string{"nats"},
		Phases: []string{"impact"}, Relays: 1, ImpactFor: 2 * time.Second, ImpactClients: 4, ImpactSink: "kafka",
		ProfileDir: dir, RelayBin: relayBin, Args: []string{"relaybench", "(impact profile test)"},
	}
	res := runBench(t, opts, 5*time.Minute)
	if res.Impact == nil || len(res.Impact.Runs) != 2 {
		t.Fatalf("impact: %+v", res.Impact)
	}
	r := res.Impact.Runs[1]
	if r.Sink != "kafka" || !r.Complete || r.EventsRelayed != r.Transactions || r.RelayCPUSeconds <= 0 {
		t.Errorf("impact run %s into %s: relayed %d of %d, relay CPU %.2fs", r.Relay, r.Sink, r.EventsRelayed, r.Transactions, r.RelayCPUSeconds)
	}
	if r.ProduceRequestsPer100k <= 0 || r.ProduceRequestsPer100k > 100_000 {
		t.Errorf("impact run into kfake: %.0f produce requests per 100,000 events, want some and at most one per event", r.ProduceRequestsPer100k)
	}
	fi, err := os.Stat(filepath.Join(dir, "impact-wal", "cpu.pprof"))
	if err != nil || fi.Size() == 0 {
		t.Errorf("cpu profile: %v, %v", fi, err)
	}
}

// TestInsertSmoke runs the insert phase for a second on the default outbox
// and on the partition ring: every committed insert is a row, and each run
// has its WAL bytes and size.
func TestInsertSmoke(t *testing.T) {
	opts := Options{
		Events: 1000, Aggregates: 500, Payload: 200, Modes: []string{"poll"}, Phases: []string{"insert"}, Relays: 1,
		InsertFor: time.Second, InsertClients: 2, InsertVariants: []string{"default", "ring8"}, Background: 0,
		RelayBin: relayBin, Args: []string{"relaybench", "(insert smoke test)"},
	}
	res := runBench(t, opts, 5*time.Minute)
	table := tableOf(t, res)
	if res.Insert == nil || len(res.Insert.Variants) != 2 || res.Insert.Pinning == "" {
		t.Fatalf("insert: %+v", res.Insert)
	}
	for i, v := range res.Insert.Variants {
		// Each client inserted one row before the load.
		if v.Variant != opts.InsertVariants[i] || v.Inserts == 0 || v.Rows != v.Inserts+int64(opts.InsertClients) ||
			v.WALPerInsert <= 0 || v.SizeBytes <= 0 || v.PostgresPer100k <= 0 {
			t.Errorf("insert variant %d (want %s): %+v", i, opts.InsertVariants[i], v)
		}
	}
	if !strings.Contains(table.String(), "WHAT AN OUTBOX ROW COSTS THE INSERT") {
		t.Errorf("no insert table:\n%s", table.String())
	}
}

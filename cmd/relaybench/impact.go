package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outboxrelay/relay/helpers/outbox"
	xrate "golang.org/x/time/rate"
)

// accountRows is the size of the application's accounts table in the
// impact phase (pgbench's pgbench_accounts at scale 1).
const accountRows = 100_000

// accountsDDL is the application's own table of the impact phase, filled
// with accountRows rows and vacuumed before each run.
const accountsDDL = `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, filler char(84) NOT NULL DEFAULT '')`

const updateAccount = `UPDATE accounts SET balance = balance + 1 WHERE id = $1`

// Impact is what the relay costs the application: the same transaction
// load without a relay and with one per capture mode.
type Impact struct {
	// Pinning says whether the PostgreSQL server was pinned to CPU 0 and
	// this bench (with NATS and the relay) to the other CPUs, and if not why.
	Pinning string `json:"pinning"`
	Pinned  bool   `json:"pinned"`
	// RateLimit is -impact-rate: the most transactions per second of all
	// clients together; 0: as fast as they commit.
	RateLimit int `json:"rate_limit,omitempty"`
	// Rounds is how many times the list of runs ran, interleaved.
	Rounds int `json:"rounds"`
	// SyncCommit is the clients' synchronous_commit.
	SyncCommit string `json:"synchronous_commit"`
	// Previous is the git revision of the previous release's relay runs.
	Previous string         `json:"previous_release,omitempty"`
	Runs     []ImpactResult `json:"runs"`
	// Summary has one row per run of a round: the means over the rounds,
	// with the targets of each relay.
	Summary []ImpactSummary `json:"summary"`
}

// ImpactResult is one run of the impact phase: Clients connections each
// committing `UPDATE accounts …; INSERT INTO outbox …` transactions in a
// loop for Seconds, with Relay ("none", "poll", "wal", … see impactRuns) relaying the
// outbox into Sink (NATS JetStream, or kfake with -impact-sink kafka), or
// with a floor (floor_poll, floor_wal, floor_wal_delete: What) handling the
// outbox in its place. The costs per 100,000 events are over the load and
// the relay's or floor's catch-up after it; a floor's own CPU and system
// calls are in the relay's fields, and it counts every committed event as
// relayed once it caught up.
type ImpactResult struct {
	Relay          string      `json:"relay"`
	Round          int         `json:"round"`
	What           string      `json:"what,omitempty"`
	Sink           string      `json:"sink,omitempty"`
	Clients        int         `json:"clients"`
	Seconds        float64     `json:"seconds"`
	Transactions   int64       `json:"transactions"`
	TPS            float64     `json:"tps"`
	Latency        Percentiles `json:"commit_latency"`
	EventsRelayed  int64       `json:"events_relayed"`
	Complete       bool        `json:"complete"` // every committed event reached the stream
	CatchUpSeconds float64     `json:"catch_up_seconds"`
	// BehindAtEnd is how many committed events the relay had not relayed
	// when the load ended.
	BehindAtEnd int64 `json:"behind_at_load_end"`
	// SlotLagBytes are the slot's lag in WAL bytes, sampled every second
	// during the load (wal mode: the relays and the floors).
	SlotLagBytes    []int64 `json:"slot_lag_bytes,omitempty"`
	RelayCPUSeconds float64 `json:"relay_cpu_seconds"`
	RelayCPUPer100k float64 `json:"relay_cpu_seconds_per_100k"`
	PostgresPer100k float64 `json:"postgres_cpu_seconds_per_100k"`
	WALBytes        int64   `json:"wal_bytes"`
	WALBytesPer100k float64 `json:"wal_bytes_per_100k"`
	DeadTuples      int64   `json:"outbox_n_dead_tup"`
	DeadPer100k     float64 `json:"outbox_dead_tuples_per_100k"`
	DeletesPer100k  float64 `json:"outbox_deletes_per_100k"`
	UpdatesPer100k  float64 `json:"outbox_updates_per_100k"`
	// OtherCommitsPer100k counts the database's committed transactions
	// other than the application's: the relay's (archives, claims, checks)
	// and a few of the bench's own queries.
	OtherCommitsPer100k float64 `json:"other_commits_per_100k"`
	// RelaySyscallsPer100k and RelaySwitchesPer100k are the relay's read
	// and write system calls and its threads' context switches.
	RelaySyscallsPer100k float64 `json:"relay_syscalls_per_100k,omitempty"`
	RelaySwitchesPer100k float64 `json:"relay_context_switches_per_100k,omitempty"`
	// ProduceRequestsPer100k is how many produce requests kfake received
	// (-impact-sink kafka): the relay's Kafka client pays a round of
	// wakeups and system calls for each.
	ProduceRequestsPer100k float64 `json:"kafka_produce_requests_per_100k,omitempty"`

	relaySyscalls, relaySwitches int64
	produceRequests              int64
	TPSRatio                     float64 `json:"tps_ratio_to_no_relay,omitempty"`
	P99Ratio                     float64 `json:"p99_ratio_to_no_relay,omitempty"`
	// Floor is the run of the same phase that TPSToFloor and
	// PostgresToFloor compare this one with (floorOf).
	Floor           string  `json:"floor,omitempty"`
	TPSToFloor      float64 `json:"tps_ratio_to_floor,omitempty"`
	PostgresToFloor float64 `json:"postgres_cpu_per_100k_ratio_to_floor,omitempty"`
	CPU             cpuUse  `json:"cpu"`
}

// impact runs the application's load without a relay, then per mode with
// its floors (-impact-floors) and with its relay, each in a fresh database,
// and the previous release's relays (-impact-previous); the whole list
// -impact-rounds times, interleaved (impact phase).
func (b *bench) impact(ctx context.Context) error {
	if !b.opts.has("impact") {
		return nil
	}
	im := &Impact{RateLimit: b.opts.ImpactRate, Rounds: max(b.opts.ImpactRounds, 1), SyncCommit: b.opts.ImpactSyncCommit,
		Previous: b.opts.ImpactPrevious}
	b.res.Impact = im
	if im.Previous != "" {
		bin, err := b.buildPrevious(ctx, im.Previous)
		if err != nil {
			return fmt.Errorf("impact, previous release %s: %w", im.Previous, err)
		}
		b.prevBin = bin
	}
	var restore func()
	im.Pinned, im.Pinning, restore = b.pin()
	defer restore()
	b.opts.logf("impact: %s", im.Pinning)
	modes := b.opts.ImpactModes
	if len(modes) == 0 {
		modes = b.modes
	}
	runs := impactRuns(modes, b.opts.ImpactFloors, im.Previous != "")
	for round := 1; round <= im.Rounds; round++ {
		for _, run := range runs {
			r, err := b.impactRun(ctx, run)
			r.Round = round
			im.Runs = append(im.Runs, r)
			impactRatios(im.Runs)
			if err != nil {
				return fmt.Errorf("impact, %s: %w", runLabel(run), err)
			}
			b.logImpact(run, im.Runs[len(im.Runs)-1])
		}
	}
	im.Summary = summarize(im.Runs)
	return nil
}

// logImpact logs the figures of impact run r.
func (b *bench) logImpact(run string, r ImpactResult) {
	produce := ""
	if r.ProduceRequestsPer100k > 0 {
		produce = fmt.Sprintf(", %.0f Kafka produce requests /100k", r.ProduceRequestsPer100k)
	}
	b.opts.logf("impact, round %d, %s: %.0f TPS (%.2f× no relay), p50 %.2f ms, p99 %.2f ms, %d events relayed, %d behind at the load's end, relay CPU %.2f s/100k, postgres CPU %.2f s/100k, %.0f syscalls and %.0f context switches /100k%s",
		r.Round, runLabel(run), r.TPS, r.TPSRatio, r.Latency.P50, r.Latency.P99, r.EventsRelayed, r.BehindAtEnd, r.RelayCPUPer100k, r.PostgresPer100k, r.RelaySyscallsPer100k, r.RelaySwitchesPer100k, produce)
}

// noneMessages is the impact run without a relay whose clients emit the
// table-free outbox's messages instead of inserting rows: the messages
// relay's TPS is compared with it.
const noneMessages = "none_messages"

// previousSuffix marks the runs of the previous release's relay
// (-impact-previous): "poll" + previousSuffix.
const previousSuffix = "@previous"

// impactRuns returns one round of the impact phase's runs in order: no
// relay (and no relay emitting messages, with the messages mode), then per
// mode its floors (with floors) and its relay, then with previous the
// previous release's poll and wal relays.
func impactRuns(modes []string, floors, previous bool) []string {
	runs := []string{"none"}
	if slices.Contains(modes, "messages") {
		runs = append(runs, noneMessages)
	}
	for _, m := range modes {
		if floors {
			runs = append(runs, floorsOf[m]...)
		}
		runs = append(runs, m)
	}
	for _, m := range []string{"poll", "wal"} {
		if previous && slices.Contains(modes, m) {
			runs = append(runs, m+previousSuffix)
		}
	}
	return runs
}

// runBase returns the relay of run without the previous release's suffix,
// and whether run is the previous release's.
func runBase(run string) (string, bool) {
	base, prev := strings.CutSuffix(run, previousSuffix)
	return base, prev
}

// impactMode returns the capture mode of run's database: poll for the
// runs without a relay and the poll floors and relays, wal otherwise.
func impactMode(run string) string {
	base, _ := runBase(run)
	switch base {
	case "none", noneMessages, floorPoll, floorPollPublish, "poll":
		return "poll"
	}
	return "wal"
}

// noRelay reports whether run runs nothing beside the application.
func noRelay(run string) bool { return run == "none" || run == noneMessages }

// emits reports whether run's clients emit messages (the table-free
// outbox) rather than insert rows.
func emits(run string) bool { return run == noneMessages || run == "messages" }

// walRelay reports whether run is a relay in wal mode.
func walRelay(run string) bool { return impactMode(run) == "wal" && !isFloor(run) }

// runLabel names run in the table and the log.
func runLabel(run string) string {
	if l, ok := map[string]string{"none": "no relay", noneMessages: "no relay, messages emitted", floorPoll: "poll floor (DELETE … RETURNING)",
		floorPollPublish: "poll floor + publish", floorWAL: "wal floor (pg_recvlogical, rows stay)", floorWALDelete: "wal floor + DELETE every 20 ms",
		"messages": "table-free relay (messages)", "partition": "wal relay, archive.mode partition"}[run]; ok {
		return l
	}
	if base, prev := runBase(run); prev {
		return base + " relay, previous release"
	}
	return run + " relay"
}

// impactRatios sets, for each run, its ratios to the run without a relay
// of its round (emitting messages like it or not) and to its floor's run
// of its round (floorOf), once both were measured.
func impactRatios(runs []ImpactResult) {
	for i := range runs {
		r := &runs[i]
		base := "none"
		if emits(r.Relay) {
			base = noneMessages
		}
		for _, o := range runs {
			if o.Round != r.Round {
				continue
			}
			if o.Relay == base && o.TPS > 0 && o.Latency.P99 > 0 && r.Relay != base {
				r.TPSRatio, r.P99Ratio = r.TPS/o.TPS, r.Latency.P99/o.Latency.P99
			}
			if o.Relay == floorOf(r.Relay) && o.TPS > 0 && o.PostgresPer100k > 0 {
				r.Floor, r.TPSToFloor, r.PostgresToFloor = o.Relay, r.TPS/o.TPS, r.PostgresPer100k/o.PostgresPer100k
			}
		}
	}
}

// pin pins the PostgreSQL server (the postmaster, its processes and the
// backends it forks later) to CPU 0 and this process (NATS, the clients and
// the relays and floors it starts later) to the other CPUs when taskset
// exists and the machine has two CPUs or more. It returns whether it did,
// what it did (or why not), and what undoes it.
func (b *bench) pin() (bool, string, func()) {
	none := func() {}
	cpus := b.res.Machine.CPUs
	pm := int(postmaster.Load())
	_, err := exec.LookPath("taskset")
	switch {
	case err != nil:
		return false, "not pinned: taskset not found", none
	case cpus < 2:
		return false, "not pinned: one CPU", none
	case pm == 0:
		return false, "not pinned: the postmaster's pid is unknown", none
	}
	all, rest := fmt.Sprintf("0-%d", cpus-1), fmt.Sprintf("1-%d", cpus-1)
	if cpus == 2 {
		rest = "1"
	}
	if err := taskset("0", serverPids(pm)...); err != nil {
		return false, "not pinned: " + err.Error(), none
	}
	if err := taskset(rest, os.Getpid()); err != nil {
		_ = taskset(all, serverPids(pm)...)
		return false, "not pinned: " + err.Error(), none
	}
	return true, fmt.Sprintf("pinned with taskset: PostgreSQL on CPU 0, the bench (clients, NATS) and the relay or floor on CPUs %s", rest), func() {
		_ = taskset(all, serverPids(pm)...)
		_ = taskset(all, os.Getpid())
	}
}

// serverPids returns the postmaster pm and its child processes.
func serverPids(pm int) []int {
	pids := []int{pm}
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if _, ppid, _, _, err := procTimes(pid); err == nil && ppid == pm {
			pids = append(pids, pid)
		}
	}
	return pids
}

// taskset sets the CPU list of every thread of each pid; a process that
// has exited in between is skipped.
func taskset(list string, pids ...int) error {
	for i, pid := range pids {
		out, err := exec.Command("taskset", "-a", "-p", "-c", list, strconv.Itoa(pid)).CombinedOutput()
		if err != nil && (i == 0 || processExists(pid)) {
			return fmt.Errorf("taskset -a -p -c %s %d: %v: %s", list, pid, err, firstLine(string(out)))
		}
	}
	return nil
}

func processExists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// outboxStats is the outbox's row of pg_stat_user_tables, and the
// database's committed transactions (pg_stat_database.xact_commit).
type outboxStats struct{ dead, del, upd, commits int64 }

// The outbox's figures are summed over its partitions, and are 0 without
// an outbox table (the table-free outbox).
func readOutboxStats(ctx context.Context, d *database) (outboxStats, error) {
	var s outboxStats
	err := d.pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_tup_del), 0), coalesce(sum(n_tup_upd), 0),
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
		FROM pg_stat_user_tables WHERE relid = to_regclass('outbox')
			OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('outbox'))`).
		Scan(&s.dead, &s.del, &s.upd, &s.commits)
	return s, err
}

// walLSN returns pg_current_wal_lsn() in bytes.
func walLSN(ctx context.Context, d *database) (int64, error) {
	var n int64
	err := d.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&n)
	return n, err
}

// impactSide is what runs beside the application in one impact run: the
// relay, a floor's processes, or nothing ("none").
type impactSide struct {
	run   string
	procs []*relayProc
	sink0 uint64 // the sink's messages before the load, with a relay
}

// impactRun runs the load once in a fresh database with run beside it
// ("none": nothing).
func (b *bench) impactRun(ctx context.Context, run string) (ImpactResult, error) {
	res := ImpactResult{Relay: run, What: floorWhat[run], Sink: b.opts.ImpactSink, Clients: b.opts.ImpactClients}
	if isFloor(run) && run != floorPollPublish {
		res.Sink = ""
	}
	d, err := b.impactDatabase(ctx, run)
	if err != nil {
		return res, err
	}
	defer b.dropDatabase(d)
	side, err := b.startSide(ctx, d, run)
	defer side.stop()
	if err != nil {
		return res, err
	}
	st0, err := readOutboxStats(ctx, d)
	if err != nil {
		return res, err
	}
	wal0, err := walLSN(ctx, d)
	if err != nil {
		return res, err
	}
	if err := b.measureLoad(ctx, d, side, &res); err != nil {
		return res, err
	}
	wal1, err := walLSN(ctx, d)
	if err != nil {
		return res, err
	}
	res.WALBytes = wal1 - wal0
	if err := side.stop(); err != nil {
		return res, err
	}
	// Backends report their table statistics at most once a second and when
	// they exit: wait for the last reports of the clients and the relay.
	time.Sleep(1500 * time.Millisecond)
	st1, err := readOutboxStats(ctx, d)
	if err != nil {
		return res, err
	}
	res.perEvent(st0, st1)
	return res, nil
}

// startSide starts what runs beside the application in run on d: the
// relay of a mode, or a floor. A wal relay, like the wal floors, has
// decoded the setup's WAL when it returns.
func (b *bench) startSide(ctx context.Context, d *database, run string) (*impactSide, error) {
	s := &impactSide{run: run}
	var err error
	switch {
	case noRelay(run):
	case isFloor(run):
		if s.procs, err = b.startFloor(ctx, d, run); err == nil && run == floorPollPublish {
			s.sink0, err = b.sinkCount(ctx, d)
		}
	default:
		var p *relayProc
		if p, err = b.impactRelay(ctx, d, run); err != nil {
			return s, err
		}
		s.procs = []*relayProc{p}
		if walRelay(run) {
			if err := decoderCatchUp(ctx, d, s.procs); err != nil {
				return s, err
			}
		}
		s.sink0, err = b.sinkCount(ctx, d)
	}
	return s, err
}

// measureLoad runs the application's load with side beside it and waits
// until side handled every committed event. It records the load, and
// side's CPU seconds, system calls and context switches over both, in res.
func (b *bench) measureLoad(ctx context.Context, d *database, side *impactSide, res *ImpactResult) error {
	side0, cpu0, count0, produce0 := side.cpu(), sampleCPU(), side.counters(), b.produceRequests()
	lag := sampleLag(ctx, d, impactMode(side.run) == "wal" && !noRelay(side.run))
	err := b.applicationLoad(ctx, d, emits(side.run), res)
	res.SlotLagBytes = lag()
	if err != nil {
		return err
	}
	if len(side.procs) > 0 && !isFloor(side.run) {
		if n, err := b.sinkCount(ctx, d); err == nil {
			res.BehindAtEnd = res.Transactions - int64(n-side.sink0)
		}
	}
	if err := b.waitHandled(ctx, d, side, res); err != nil {
		return err
	}
	res.RelayCPUSeconds = side.cpu() - side0
	count1 := side.counters()
	res.relaySyscalls, res.relaySwitches = count1.syscalls-count0.syscalls, count1.switches-count0.switches
	res.produceRequests = b.produceRequests() - produce0
	res.CPU = cpuBetween(cpu0, sampleCPU(), res.RelayCPUSeconds)
	return nil
}

// lagEvery is how often sampleLag samples the slot's lag.
const lagEvery = time.Second

// sampleLag samples, with on, the lag of d's slot (the WAL between the
// server's WAL position and the slot's confirmed position) every lagEvery
// until the function it returns is called, which returns the samples.
func sampleLag(ctx context.Context, d *database, on bool) func() []int64 {
	if !on {
		return func() []int64 { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	var samples []int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(lagEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var lag int64
			if err := d.pool.QueryRow(ctx, `SELECT coalesce((SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots
				WHERE slot_name = $1), 0)::bigint`, d.slot()).Scan(&lag); err == nil {
				samples = append(samples, lag)
			}
		}
	}()
	return func() []int64 {
		cancel()
		<-done
		return samples
	}
}

// keepsUp reports whether the slot's lag samples lags, taken each
// lagEvery during a load, did not grow: the mean of their second half is
// at most 1.5 times the mean of their first half plus 1 MB (a lag of a
// few batches).
func keepsUp(lags []int64) bool {
	if len(lags) < 4 {
		return true
	}
	half := len(lags) / 2
	return meanOf(lags[half:]) <= 1.5*meanOf(lags[:half])+1<<20
}

// meanOf returns the mean of v, not empty.
func meanOf(v []int64) float64 {
	var sum float64
	for _, x := range v {
		sum += float64(x)
	}
	return sum / float64(len(v))
}

// perEvent sets the run's costs per 100,000 events from its totals and the
// outbox's statistics before (st0) and after (st1) it.
func (res *ImpactResult) perEvent(st0, st1 outboxStats) {
	events := res.EventsRelayed
	if noRelay(res.Relay) {
		events = res.Transactions
	}
	per := func(v float64) float64 { return v * 100_000 / max(float64(events), 1) }
	if !noRelay(res.Relay) {
		res.RelayCPUPer100k = per(res.RelayCPUSeconds)
		res.RelaySyscallsPer100k, res.RelaySwitchesPer100k = per(float64(res.relaySyscalls)), per(float64(res.relaySwitches))
		res.ProduceRequestsPer100k = per(float64(res.produceRequests))
	}
	res.PostgresPer100k = per(res.CPU.PostgresSeconds)
	res.WALBytesPer100k = per(float64(res.WALBytes))
	res.DeadTuples = st1.dead
	res.DeadPer100k = per(float64(st1.dead))
	res.DeletesPer100k = per(float64(st1.del - st0.del))
	res.UpdatesPer100k = per(float64(st1.upd - st0.upd))
	res.OtherCommitsPer100k = per(float64(st1.commits - st0.commits - res.Transactions))
}

// impactDatabase creates the fresh database of one impact run with `relay
// init` of run's relay (the previous release's for its runs; poll mode
// for the runs without a relay) and the application's accounts table,
// vacuumed.
func (b *bench) impactDatabase(ctx context.Context, run string) (*database, error) {
	base, _ := runBase(run)
	d, err := b.newSinkDatabase(ctx, "impact_"+strings.ReplaceAll(run, previousSuffix, "_previous"), impactMode(run), b.opts.ImpactSink)
	if err != nil {
		return nil, err
	}
	switch base {
	case "messages":
		d.walSource = "messages"
	case "partition":
		d.archiveMode = "partition"
	}
	for _, step := range []func() error{
		func() (err error) { d.cfgPath, d.port, err = d.configCopy(d.name); return err },
		func() error { return b.initWith(ctx, b.binOf(run), d) },
		func() error { return d.exec(ctx, accountsDDL) },
		func() error {
			return d.exec(ctx, `INSERT INTO accounts (id) SELECT generate_series(1, $1)`, accountRows)
		},
		func() error { return vacuumOutbox(ctx, d) },
		func() error { return d.exec(ctx, "VACUUM ANALYZE accounts") },
	} {
		if err := step(); err != nil {
			b.dropDatabase(d)
			return nil, err
		}
	}
	return d, nil
}

// vacuumOutbox runs prepareBacklog (VACUUM ANALYZE outbox, CHECKPOINT) when
// d has an outbox table, and a CHECKPOINT otherwise (the table-free outbox).
func vacuumOutbox(ctx context.Context, d *database) error {
	var exists bool
	if err := d.pool.QueryRow(ctx, `SELECT to_regclass('outbox') IS NOT NULL`).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return d.exec(ctx, "CHECKPOINT")
	}
	return prepareBacklog(ctx, d)
}

// binOf returns the relay binary of run: the previous release's for its
// runs, else the bench's.
func (b *bench) binOf(run string) string {
	if _, prev := runBase(run); prev {
		return b.prevBin
	}
	return b.relayBin
}

// impactRelay starts the relay of an impact run on d and waits until it is
// ready. With -cpuprofile the relay is this binary re-executed as a
// profiling relay, writing DIR/impact-<run>/cpu.pprof and allocs.pprof.
func (b *bench) impactRelay(ctx context.Context, d *database, run string) (*relayProc, error) {
	start := relayStarter(b.startRelay)
	if _, prev := runBase(run); prev {
		start = b.startRelayBin(b.prevBin)
	} else if b.opts.ProfileDir != "" {
		dir := filepath.Join(b.opts.ProfileDir, "impact-"+run)
		var err error
		if start, err = b.selfRelay(dir); err != nil {
			return nil, err
		}
		b.opts.logf("impact, relay %s: profiling relay (this binary with -as-relay), profiles to %s", run, dir)
	}
	if d.sink == "nats" {
		b.deleteStream(ctx)
	}
	relay, err := start(d, "impact_"+run)
	if err != nil {
		return nil, err
	}
	if err := relay.waitReady(ctx, 2*time.Minute); err != nil {
		relay.stop()
		return nil, err
	}
	return relay, nil
}

// procCounters are a process's read and write system calls (syscr and
// syscw of /proc/<pid>/io) and context switches, summed over its threads:
// the wakeups behind its CPU time, which on a busy machine vary less than
// the CPU time does.
type procCounters struct{ syscalls, switches int64 }

// counters returns the counters of side's processes so far, summed.
func (s *impactSide) counters() procCounters {
	var c procCounters
	for _, p := range s.procs {
		pid := p.cmd.Process.Pid
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid)); err == nil {
			c.syscalls += procField(string(b), "syscr") + procField(string(b), "syscw")
		}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name())); err == nil {
				c.switches += procField(string(b), "voluntary_ctxt_switches") + procField(string(b), "nonvoluntary_ctxt_switches")
			}
		}
	}
	return c
}

// procField returns the number after "name:" at the start of a line of a
// /proc file, or 0.
func procField(text, name string) int64 {
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == name {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cpu returns the CPU seconds of side's processes so far, summed.
func (s *impactSide) cpu() float64 {
	var sec float64
	for _, p := range s.procs {
		ps, _ := readProcStats(p.cmd.Process.Pid)
		sec += ps.CPUSeconds
	}
	return sec
}

// stop stops side's processes, and returns the first failure.
func (s *impactSide) stop() error {
	var first error
	for _, p := range s.procs {
		if err := p.stop(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitHandled waits until side handled every committed event of the load:
// the sink holds them (waitRelayed: a relay, the publishing poll floor),
// or the floor caught up (waitFloor); without a relay it returns at once.
func (b *bench) waitHandled(ctx context.Context, d *database, side *impactSide, res *ImpactResult) error {
	switch {
	case noRelay(side.run):
		res.Complete = true
		return nil
	case isFloor(side.run) && side.run != floorPollPublish:
		return b.waitFloor(ctx, d, side.run, side.procs, res)
	}
	return b.waitRelayed(ctx, d, side, res)
}

// waitRelayed waits up to two minutes until the sink of d holds every
// committed event past the side.sink0 messages it held before the load.
func (b *bench) waitRelayed(ctx context.Context, d *database, side *impactSide, res *ImpactResult) error {
	t0 := time.Now()
	err := waitFor(ctx, 2*time.Minute, side.procs, func() (bool, error) {
		if n, err := b.sinkCount(ctx, d); err == nil {
			res.EventsRelayed = int64(n - side.sink0)
		}
		return res.EventsRelayed >= res.Transactions, nil
	})
	if err != nil {
		return fmt.Errorf("relayed %d of %d events: %w", res.EventsRelayed, res.Transactions, err)
	}
	res.Complete, res.CatchUpSeconds = true, time.Since(t0).Seconds()
	return nil
}

// applicationLoad runs opts.ImpactClients connections with
// synchronous_commit opts.ImpactSyncCommit, each committing `UPDATE
// accounts; INSERT INTO outbox` transactions (with emit, the INSERT is an
// outbox message of the table-free outbox) in a loop for opts.ImpactFor,
// together at most opts.ImpactRate a second when it is set, and records
// their count, rate and commit latencies (from BEGIN to the end of COMMIT)
// in res.
func (b *bench) applicationLoad(ctx context.Context, d *database, emit bool, res *ImpactResult) error {
	clients := b.opts.ImpactClients
	conns := make([]*pgx.Conn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	cfg, err := pgx.ParseConfig(d.dsn)
	if err != nil {
		return err
	}
	if b.opts.ImpactSyncCommit != "" {
		cfg.RuntimeParams["synchronous_commit"] = b.opts.ImpactSyncCommit
	}
	for i := range conns {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		conns[i] = c
	}
	lim := xrate.NewLimiter(xrate.Inf, 1)
	if r := b.opts.ImpactRate; r > 0 {
		lim = xrate.NewLimiter(xrate.Limit(r), 1)
	}
	n, el, hist, err := closedLoop(clients, 13, b.opts.ImpactFor, func(w int, rng *rand.Rand, i int) error {
		if err := lim.Wait(ctx); err != nil {
			return err
		}
		return accountTransaction(ctx, conns[w], rng, uint32(w), i, b.opts.Aggregates, b.opts.Payload, emit)
	})
	res.Transactions = n
	res.Seconds = el.Seconds()
	res.TPS = newRate(n, el).PerSecond
	res.Latency = hist.summary()
	return err
}

// accountTransaction commits one application transaction: an account's
// balance update and one outbox event, a row or with emit a message of the
// table-free outbox (helpers/outbox.Emit).
func accountTransaction(ctx context.Context, c *pgx.Conn, rng *rand.Rand, tag uint32, idx, aggregates, payload int, emit bool) error {
	agg := rng.IntN(aggregates)
	id := benchID(tag, idx, rng)
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, updateAccount, 1+rng.IntN(accountRows)); err != nil {
			return err
		}
		if emit {
			_, err := outbox.Emit(ctx, tx, outbox.Event{ID: id, AggregateType: aggType, AggregateID: aggregateID(agg), EventType: "step",
				Payload: json.RawMessage(payloadFor(agg, idx, payload)), Headers: map[string]string{"source": "relaybench"}})
			return err
		}
		_, err := tx.Exec(ctx, insertOne, pgtype.UUID{Bytes: id, Valid: true}, aggType, aggregateID(agg), "step",
			payloadFor(agg, idx, payload), eventHeaders)
		return err
	})
}

// printImpact prints the impact phase's runs.
func printImpact(w io.Writer, r *Results) {
	im := r.Impact
	if im == nil || len(im.Runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s\n", im.Pinning)
	fmt.Fprintf(w, "the clients' sessions run with synchronous_commit %s; %d round(s) of every run, interleaved\n", dash(im.SyncCommit), im.Rounds)
	if im.Previous != "" {
		fmt.Fprintf(w, "previous release: the relay built at %s\n", im.Previous)
	}
	if im.RateLimit > 0 {
		fmt.Fprintf(w, "the clients commit at most %d transactions per second together\n", im.RateLimit)
	}
	t := newTable(w, "IMPACT ON THE APPLICATION", "round", "clients", "TPS", "TPS ×", "TPS × floor", "p50 ms", "p99 ms", "p99 ×", "events relayed",
		"relay CPU s/100k", "postgres CPU s/100k", "PG CPU × floor", "WAL MB/100k", "dead tup/100k", "del/100k", "upd/100k", "relay commits/100k", "other CPU s")
	for _, x := range im.Runs {
		tps, p99, relayed, relayCPU := "1.00×", "1.00×", "-", "-"
		if !noRelay(x.Relay) {
			tps, p99 = fmt.Sprintf("%.2f×", x.TPSRatio), fmt.Sprintf("%.2f×", x.P99Ratio)
			relayed, relayCPU = fmt.Sprint(x.EventsRelayed), f2(x.RelayCPUPer100k)
		}
		name := runLabel(x.Relay)
		if !x.Complete {
			name += " (INCOMPLETE)"
		}
		t.row(name, fmt.Sprint(x.Round), fmt.Sprint(x.Clients), f0(x.TPS), tps, ratioCell(x.TPSToFloor), f2(x.Latency.P50), f2(x.Latency.P99), p99, relayed, relayCPU,
			f2(x.PostgresPer100k), ratioCell(x.PostgresToFloor), f1(x.WALBytesPer100k/1e6), f0(x.DeadPer100k), f0(x.DeletesPer100k), f0(x.UpdatesPer100k),
			f0(x.OtherCommitsPer100k), f1(x.CPU.OtherSeconds))
	}
	t.flush()
	printImpactSummary(w, im)
	fmt.Fprintln(w, "floors: what any relay costs the database at least, their own CPU in the relay CPU column; "+
		"× floor compares a relay with its mode's first floor, the wal floor + DELETE with the wal floor")
}

// ratioCell formats a ratio, "-" when it is 0 (not measured).
func ratioCell(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", v)
}

// ImpactSummary is one run of the impact phase over its rounds (medians),
// with the targets of a relay of this build: the application's TPS ratio
// at least the wal floor's less 0.03 (the table-free relay's TPS taken
// against the run without a relay that inserts rows, the application it
// replaces), the relay's CPU per event at most 1.5 times the wal floor's,
// and for a wal relay a slot lag that does not grow over the load
// (keepsUp).
type ImpactSummary struct {
	Relay           string  `json:"relay"`
	Rounds          int     `json:"rounds"`
	TPS             float64 `json:"tps"`
	TPSRatio        float64 `json:"tps_ratio_to_no_relay"`
	TPSRatioMin     float64 `json:"tps_ratio_min"`
	TPSRatioMax     float64 `json:"tps_ratio_max"`
	P99Ratio        float64 `json:"p99_ratio_to_no_relay"`
	RelayCPUPer100k float64 `json:"relay_cpu_seconds_per_100k"`
	PostgresPer100k float64 `json:"postgres_cpu_seconds_per_100k"`
	WALBytesPer100k float64 `json:"wal_bytes_per_100k"`
	DeadPer100k     float64 `json:"outbox_dead_tuples_per_100k"`
	DeletesPer100k  float64 `json:"outbox_deletes_per_100k"`
	BehindAtEnd     float64 `json:"behind_at_load_end"`
	CatchUpSeconds  float64 `json:"catch_up_seconds"`
	// SlotLagMB is the slot's mean lag over the load's second half, the
	// median of the rounds'; growing says whether it grew in any round
	// (keepsUp).
	SlotLagMB float64 `json:"slot_lag_mb"`
	growing   bool
	// TPSTarget, CPUTarget and KeepsUp are "met", "missed", or empty when
	// the target does not apply or its floor was not measured.
	TPSTarget string `json:"tps_target,omitempty"`
	CPUTarget string `json:"cpu_target,omitempty"`
	KeepsUp   string `json:"keeps_up,omitempty"`
}

// summarize sums runs up per relay over the rounds (summary), in the order
// of the first round, and judges the targets of this build's relays.
func summarize(runs []ImpactResult) []ImpactSummary {
	var out []ImpactSummary
	for _, r := range runs {
		if r.Round != 1 {
			continue
		}
		var rounds []ImpactResult
		for _, x := range runs {
			if x.Relay == r.Relay {
				rounds = append(rounds, x)
			}
		}
		out = append(out, summary(r.Relay, rounds))
	}
	judge(out)
	return out
}

// summary returns the summary of relay's rounds: the median of each
// figure, which one round disturbed by the machine (a checkpoint, a
// neighbour) does not move, and the range of the TPS ratio.
func summary(relay string, rounds []ImpactResult) ImpactSummary {
	s := ImpactSummary{Relay: relay, Rounds: len(rounds), TPSRatioMin: math.Inf(1)}
	med := func(f func(ImpactResult) float64) float64 {
		v := make([]float64, len(rounds))
		for i, x := range rounds {
			v[i] = f(x)
		}
		slices.Sort(v)
		if n := len(v); n%2 == 0 {
			return (v[n/2-1] + v[n/2]) / 2
		}
		return v[len(v)/2]
	}
	s.TPS = med(func(x ImpactResult) float64 { return x.TPS })
	s.TPSRatio = med(func(x ImpactResult) float64 { return x.TPSRatio })
	s.P99Ratio = med(func(x ImpactResult) float64 { return x.P99Ratio })
	s.RelayCPUPer100k = med(func(x ImpactResult) float64 { return x.RelayCPUPer100k })
	s.PostgresPer100k = med(func(x ImpactResult) float64 { return x.PostgresPer100k })
	s.WALBytesPer100k = med(func(x ImpactResult) float64 { return x.WALBytesPer100k })
	s.DeadPer100k = med(func(x ImpactResult) float64 { return x.DeadPer100k })
	s.DeletesPer100k = med(func(x ImpactResult) float64 { return x.DeletesPer100k })
	s.BehindAtEnd = med(func(x ImpactResult) float64 { return float64(x.BehindAtEnd) })
	s.CatchUpSeconds = med(func(x ImpactResult) float64 { return x.CatchUpSeconds })
	s.SlotLagMB = med(func(x ImpactResult) float64 {
		if l := x.SlotLagBytes; len(l) > 0 {
			return meanOf(l[len(l)/2:]) / 1e6
		}
		return 0
	})
	for _, x := range rounds {
		s.TPSRatioMin, s.TPSRatioMax = min(s.TPSRatioMin, x.TPSRatio), max(s.TPSRatioMax, x.TPSRatio)
		s.growing = s.growing || len(x.SlotLagBytes) > 0 && !keepsUp(x.SlotLagBytes)
	}
	return s
}

// judge sets the targets of the summaries of this build's relays against
// the wal floor's summary.
func judge(sums []ImpactSummary) {
	var floor, none *ImpactSummary
	for i := range sums {
		switch sums[i].Relay {
		case floorWAL:
			floor = &sums[i]
		case "none":
			none = &sums[i]
		}
	}
	verdict := func(ok bool) string { return map[bool]string{true: "met", false: "missed"}[ok] }
	for i := range sums {
		s := &sums[i]
		if _, prev := runBase(s.Relay); prev || isFloor(s.Relay) || noRelay(s.Relay) {
			continue
		}
		if floor != nil {
			ratio := s.TPSRatio
			if emits(s.Relay) && none != nil && none.TPS > 0 {
				ratio = s.TPS / none.TPS
			}
			s.TPSTarget = verdict(ratio >= floor.TPSRatio-0.03)
			s.CPUTarget = verdict(s.RelayCPUPer100k <= 1.5*floor.RelayCPUPer100k)
		}
		if walRelay(s.Relay) && s.Rounds > 0 {
			s.KeepsUp = verdict(!s.growing)
		}
	}
}

// printImpactSummary prints the impact phase's runs averaged over the
// rounds, with the targets.
func printImpactSummary(w io.Writer, im *Impact) {
	fmt.Fprintf(w, "summary: the median of %d round(s); targets: TPS × at least the wal floor's less 0.03, relay CPU at most 1.5 × the wal floor's, "+
		"a wal relay's slot lag not growing over the load (the mean of its second half at most 1.5 × its first half's + 1 MB)\n", im.Rounds)
	t := newTable(w, "IMPACT SUMMARY", "TPS", "TPS ×", "TPS × range", "p99 ×", "relay CPU s/100k", "postgres CPU s/100k", "WAL MB/100k", "dead tup/100k", "del/100k",
		"behind at end", "catch-up s", "slot lag MB", "TPS target", "CPU target", "keeps up")
	for _, s := range im.Summary {
		tps, rng, p99, cpu := "1.00×", "-", "1.00×", "-"
		if !noRelay(s.Relay) {
			tps, rng, p99 = fmt.Sprintf("%.2f×", s.TPSRatio), fmt.Sprintf("%.2f–%.2f", s.TPSRatioMin, s.TPSRatioMax), fmt.Sprintf("%.2f×", s.P99Ratio)
			cpu = f2(s.RelayCPUPer100k)
		}
		t.row(runLabel(s.Relay), f0(s.TPS), tps, rng, p99, cpu, f2(s.PostgresPer100k), f1(s.WALBytesPer100k/1e6), f0(s.DeadPer100k),
			f0(s.DeletesPer100k), f0(s.BehindAtEnd), f1(s.CatchUpSeconds), f1(s.SlotLagMB), dash(s.TPSTarget), dash(s.CPUTarget), dash(s.KeepsUp))
	}
	t.flush()
}

// dash returns s, or "-" when it is empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

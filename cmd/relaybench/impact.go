package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	RateLimit int            `json:"rate_limit,omitempty"`
	Runs      []ImpactResult `json:"runs"`
}

// ImpactResult is one run of the impact phase: Clients connections each
// committing `UPDATE accounts …; INSERT INTO outbox …` transactions in a
// loop for Seconds, with Relay ("none", "poll" or "wal") relaying the
// outbox into Sink (NATS JetStream, or kfake with -impact-sink kafka), or
// with a floor (floor_poll, floor_wal, floor_wal_delete: What) handling the
// outbox in its place. The costs per 100,000 events are over the load and
// the relay's or floor's catch-up after it; a floor's own CPU and system
// calls are in the relay's fields, and it counts every committed event as
// relayed once it caught up.
type ImpactResult struct {
	Relay           string      `json:"relay"`
	What            string      `json:"what,omitempty"`
	Sink            string      `json:"sink,omitempty"`
	Clients         int         `json:"clients"`
	Seconds         float64     `json:"seconds"`
	Transactions    int64       `json:"transactions"`
	TPS             float64     `json:"tps"`
	Latency         Percentiles `json:"commit_latency"`
	EventsRelayed   int64       `json:"events_relayed"`
	Complete        bool        `json:"complete"` // every committed event reached the stream
	CatchUpSeconds  float64     `json:"catch_up_seconds"`
	RelayCPUSeconds float64     `json:"relay_cpu_seconds"`
	RelayCPUPer100k float64     `json:"relay_cpu_seconds_per_100k"`
	PostgresPer100k float64     `json:"postgres_cpu_seconds_per_100k"`
	WALBytes        int64       `json:"wal_bytes"`
	WALBytesPer100k float64     `json:"wal_bytes_per_100k"`
	DeadTuples      int64       `json:"outbox_n_dead_tup"`
	DeadPer100k     float64     `json:"outbox_dead_tuples_per_100k"`
	DeletesPer100k  float64     `json:"outbox_deletes_per_100k"`
	UpdatesPer100k  float64     `json:"outbox_updates_per_100k"`
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
// its floors (-impact-floors) and with its relay, each in a fresh database
// (impact phase).
func (b *bench) impact(ctx context.Context) error {
	if !b.opts.has("impact") {
		return nil
	}
	im := &Impact{RateLimit: b.opts.ImpactRate}
	b.res.Impact = im
	var restore func()
	im.Pinned, im.Pinning, restore = b.pin()
	defer restore()
	b.opts.logf("impact: %s", im.Pinning)
	for _, run := range impactRuns(b.modes, b.opts.ImpactFloors) {
		r, err := b.impactRun(ctx, run)
		if base := im.Runs; len(base) > 0 && base[0].TPS > 0 && base[0].Latency.P99 > 0 {
			r.TPSRatio, r.P99Ratio = r.TPS/base[0].TPS, r.Latency.P99/base[0].Latency.P99
		}
		im.Runs = append(im.Runs, r)
		floorRatios(im.Runs)
		if err != nil {
			return fmt.Errorf("impact, %s: %w", runLabel(run), err)
		}
		produce := ""
		if r.ProduceRequestsPer100k > 0 {
			produce = fmt.Sprintf(", %.0f Kafka produce requests /100k", r.ProduceRequestsPer100k)
		}
		b.opts.logf("impact, %s: %.0f TPS, p50 %.2f ms, p99 %.2f ms, %d events relayed, relay CPU %.2f s/100k, postgres CPU %.2f s/100k, %.0f syscalls and %.0f context switches /100k%s",
			runLabel(run), r.TPS, r.Latency.P50, r.Latency.P99, r.EventsRelayed, r.RelayCPUPer100k, r.PostgresPer100k, r.RelaySyscallsPer100k, r.RelaySwitchesPer100k, produce)
	}
	return nil
}

// impactRuns returns the impact phase's runs in order: no relay, then per
// mode its floors (with floors) and its relay.
func impactRuns(modes []string, floors bool) []string {
	runs := []string{"none"}
	for _, m := range modes {
		if floors {
			runs = append(runs, floorsOf[m]...)
		}
		runs = append(runs, m)
	}
	return runs
}

// runLabel names run in the table and the log.
func runLabel(run string) string {
	if l, ok := map[string]string{"none": "no relay", floorPoll: "poll floor (DELETE … RETURNING)",
		floorPollPublish: "poll floor + publish", floorWAL: "wal floor (pg_recvlogical, rows stay)", floorWALDelete: "wal floor + DELETE every 20 ms"}[run]; ok {
		return l
	}
	return run + " relay"
}

// floorRatios sets the ratios of each run that has a floor (floorOf) to
// that floor's run, once both were measured.
func floorRatios(runs []ImpactResult) {
	for i := range runs {
		r := &runs[i]
		for _, f := range runs {
			if f.Relay == floorOf(r.Relay) && f.TPS > 0 && f.PostgresPer100k > 0 {
				r.Floor, r.TPSToFloor, r.PostgresToFloor = f.Relay, r.TPS/f.TPS, r.PostgresPer100k/f.PostgresPer100k
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

func readOutboxStats(ctx context.Context, d *database) (outboxStats, error) {
	var s outboxStats
	err := d.pool.QueryRow(ctx, `SELECT n_dead_tup, n_tup_del, n_tup_upd,
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
		FROM pg_stat_user_tables WHERE relname = 'outbox'`).
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
	case run == "none":
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
		if run == "wal" {
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
	if err := b.applicationLoad(ctx, d, res); err != nil {
		return err
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

// perEvent sets the run's costs per 100,000 events from its totals and the
// outbox's statistics before (st0) and after (st1) it.
func (res *ImpactResult) perEvent(st0, st1 outboxStats) {
	events := res.EventsRelayed
	if res.Relay == "none" {
		events = res.Transactions
	}
	per := func(v float64) float64 { return v * 100_000 / max(float64(events), 1) }
	if res.Relay != "none" {
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
// init` (the outbox of run's mode: a floor's mode's, poll's for "none")
// and the application's accounts table, vacuumed.
func (b *bench) impactDatabase(ctx context.Context, run string) (*database, error) {
	mode := map[string]string{"none": "poll", floorPoll: "poll", floorPollPublish: "poll", floorWAL: "wal", floorWALDelete: "wal"}[run]
	if mode == "" {
		mode = run
	}
	d, err := b.newSinkDatabase(ctx, "impact_"+run, mode, b.opts.ImpactSink)
	if err != nil {
		return nil, err
	}
	for _, step := range []func() error{
		func() error { return b.initRelay(ctx, d) },
		func() error { return d.exec(ctx, accountsDDL) },
		func() error {
			return d.exec(ctx, `INSERT INTO accounts (id) SELECT generate_series(1, $1)`, accountRows)
		},
		func() error { return prepareBacklog(ctx, d) }, // vacuums the outbox
		func() error { return d.exec(ctx, "VACUUM ANALYZE accounts") },
	} {
		if err := step(); err != nil {
			b.dropDatabase(d)
			return nil, err
		}
	}
	return d, nil
}

// impactRelay starts the relay of an impact run on d and waits until it is
// ready. With -cpuprofile the relay is this binary re-executed as a
// profiling relay, writing DIR/impact-<run>/cpu.pprof and allocs.pprof.
func (b *bench) impactRelay(ctx context.Context, d *database, run string) (*relayProc, error) {
	start := relayStarter(b.startRelay)
	if b.opts.ProfileDir != "" {
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
	case side.run == "none":
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

// applicationLoad runs opts.ImpactClients connections, each committing
// `UPDATE accounts; INSERT INTO outbox` transactions in a loop for
// opts.ImpactFor, together at most opts.ImpactRate a second when it is
// set, and records their count, rate and commit latencies
// (from BEGIN to the end of COMMIT) in res.
func (b *bench) applicationLoad(ctx context.Context, d *database, res *ImpactResult) error {
	clients := b.opts.ImpactClients
	conns := make([]*pgx.Conn, clients)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		c, err := pgx.Connect(ctx, d.dsn)
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
		return accountTransaction(ctx, conns[w], rng, uint32(w), i, b.opts.Aggregates, b.opts.Payload)
	})
	res.Transactions = n
	res.Seconds = el.Seconds()
	res.TPS = newRate(n, el).PerSecond
	res.Latency = hist.summary()
	return err
}

// accountTransaction commits one application transaction: an account's
// balance update and one outbox event.
func accountTransaction(ctx context.Context, c *pgx.Conn, rng *rand.Rand, tag uint32, idx, aggregates, payload int) error {
	agg := rng.IntN(aggregates)
	id := benchID(tag, idx, rng)
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, updateAccount, 1+rng.IntN(accountRows)); err != nil {
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
	if im.RateLimit > 0 {
		fmt.Fprintf(w, "the clients commit at most %d transactions per second together\n", im.RateLimit)
	}
	t := newTable(w, "IMPACT ON THE APPLICATION", "clients", "TPS", "TPS ×", "TPS × floor", "p50 ms", "p99 ms", "p99 ×", "events relayed",
		"relay CPU s/100k", "postgres CPU s/100k", "PG CPU × floor", "WAL MB/100k", "dead tup/100k", "del/100k", "upd/100k", "relay commits/100k", "other CPU s")
	for _, x := range im.Runs {
		tps, p99, relayed, relayCPU := "1.00×", "1.00×", "-", "-"
		if x.Relay != "none" {
			tps, p99 = fmt.Sprintf("%.2f×", x.TPSRatio), fmt.Sprintf("%.2f×", x.P99Ratio)
			relayed, relayCPU = fmt.Sprint(x.EventsRelayed), f2(x.RelayCPUPer100k)
		}
		name := runLabel(x.Relay)
		if !x.Complete {
			name += " (INCOMPLETE)"
		}
		t.row(name, fmt.Sprint(x.Clients), f0(x.TPS), tps, ratioCell(x.TPSToFloor), f2(x.Latency.P50), f2(x.Latency.P99), p99, relayed, relayCPU,
			f2(x.PostgresPer100k), ratioCell(x.PostgresToFloor), f1(x.WALBytesPer100k/1e6), f0(x.DeadPer100k), f0(x.DeletesPer100k), f0(x.UpdatesPer100k),
			f0(x.OtherCommitsPer100k), f1(x.CPU.OtherSeconds))
	}
	t.flush()
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

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// Results is every figure of one run; it is what -out writes.
type Results struct {
	Command     string      `json:"command"`
	Started     time.Time   `json:"started"`
	WallSeconds float64     `json:"wall_seconds"`
	Machine     machineInfo `json:"machine"`
	// Background is the machine's CPU use over a few seconds before the
	// bench started anything: other workloads sharing it.
	Background  cpuUse            `json:"background"`
	Settings    settings          `json:"settings"`
	Unavailable map[string]string `json:"unavailable,omitempty"` // mode -> why
	// CommitRate is measured on a plain outbox table (no trigger): the
	// database's own limit, of which the steady-state loads are a share.
	CommitRate *CommitRate `json:"commit_rate,omitempty"`
	// NotifyCommitRate is the same with the statement-level NOTIFY trigger
	// of capture.poll.notify installed, which serializes the commits of
	// inserting transactions on PostgreSQL's notify-queue lock.
	NotifyCommitRate *CommitRate               `json:"commit_rate_with_notify_trigger,omitempty"`
	Baselines        map[string]BaselineResult `json:"baselines,omitempty"` // pgoutput, delete
	Drains           []DrainResult             `json:"drains,omitempty"`
	Profiles         []DrainResult             `json:"profile_drains,omitempty"`
	Scaling          []ScalePoint              `json:"scaling,omitempty"`
	Steady           []SteadyResult            `json:"steady,omitempty"`
	RSS              []RSSResult               `json:"rss,omitempty"` // -rss
	Impact           *Impact                   `json:"impact,omitempty"`
	Insert           *InsertCost               `json:"insert,omitempty"`
	Targets          []Target                  `json:"targets,omitempty"`
	Error            string                    `json:"error,omitempty"`
}

type settings struct {
	Events        int               `json:"events"`
	Aggregates    int               `json:"aggregates"`
	PayloadBytes  int               `json:"payload_bytes"`
	Modes         []string          `json:"modes"`
	Phases        []string          `json:"phases"`
	Relays        int               `json:"relays"`
	SteadySeconds float64           `json:"steady_seconds"`
	Writers       int               `json:"writers"`
	Postgres      map[string]string `json:"postgres_settings"`
	NATS          string            `json:"nats"`
	Relay         string            `json:"relay"`
	PollNotify    bool              `json:"poll_notify_trigger"`
	PollInterval  string            `json:"poll_interval"`
	PollLinger    string            `json:"poll_linger"`
	WalLinger     string            `json:"wal_linger"`
	KafkaLinger   string            `json:"kafka_linger"`
	BatchSize     int               `json:"poll_batch_size"`
}

// Run measures what opts ask for. It returns the results gathered so far
// also when it fails.
func Run(ctx context.Context, opts Options) (*Results, error) {
	began := time.Now()
	res := &Results{Command: strings.Join(opts.Args, " "), Started: began, Machine: describeMachine(),
		Unavailable: map[string]string{}, Baselines: map[string]BaselineResult{},
		Settings: settings{Events: opts.Events, Aggregates: opts.Aggregates, PayloadBytes: opts.Payload,
			Modes: opts.Modes, Phases: opts.Phases, Relays: opts.Relays, SteadySeconds: opts.Steady.Seconds(), Writers: opts.Writers,
			Postgres:   pgSettings,
			NATS:       "embedded nats-server in the bench process, JetStream file storage in a temporary directory (stream created by the relay: file storage, 2 min duplicate window)",
			Relay:      "`relay run --config` child process: archive delete, log level warn, other settings default (poll batch_size 500, interval 200ms)",
			PollNotify: opts.PollNotify, PollInterval: opts.PollInterval.String(), PollLinger: opts.PollLinger.String(),
			WalLinger: opts.WalLinger.String(), KafkaLinger: opts.KafkaLinger.String(), BatchSize: opts.BatchSize}}
	if opts.Background > 0 {
		c0 := sampleCPU()
		time.Sleep(opts.Background)
		res.Background = cpuBetween(c0, sampleCPU(), 0)
		opts.logf("background load before starting: %.0f%% of %d CPUs busy %v", res.Background.MachineBusyPercent, res.Machine.CPUs, res.Background.TopOthers)
	}
	err := run1(ctx, opts, res)
	res.WallSeconds = time.Since(began).Seconds()
	res.Targets = targets(res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func run1(ctx context.Context, opts Options, res *Results) error {
	opts.logf("starting PostgreSQL and NATS, building the relay")
	e, err := startEnv(ctx, opts)
	if err != nil {
		return err
	}
	defer e.close()
	b := &bench{env: e, opts: opts, res: res, dbs: map[string]*database{}, rawDone: !opts.has("baselines")}
	defer b.dropDatabases()
	// The steady state runs before the drains: a wal slot that sat idle
	// while the drains wrote gigabytes of WAL in other databases would have
	// to decode through all of it first.
	phases := []func(context.Context) error{b.setUp, b.commitRates, b.steadyState, b.natsDrains,
		b.sinkDrains, b.baselines, b.ratios, b.profiles, b.peakRSS, b.scaling, b.impact, b.insertCost}
	for _, phase := range phases {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	return nil
}

// bench is one run's state shared by its phases, which run in order on one
// goroutine.
type bench struct {
	*env
	opts Options
	res  *Results
	// dbs holds a database per capture mode, set up by `relay init`; modes
	// lists the modes this build provides, in opts.Modes order.
	dbs   map[string]*database
	modes []string
	// rawDone is set once the pgoutput baseline's slot exists (or no
	// baselines are measured).
	rawDone bool
}

// setUp creates a database per capture mode with `relay init`; a mode the
// build rejects is recorded as unavailable.
func (b *bench) setUp(ctx context.Context) error {
	for _, mode := range b.opts.Modes {
		d, err := b.newDatabase(ctx, "bench_"+mode, mode)
		if err != nil {
			return err
		}
		if err := b.initRelay(ctx, d); err != nil {
			b.dropDatabase(d)
			if errors.Is(err, errNotAvailable) {
				b.res.Unavailable[mode] = err.Error()
				b.opts.logf("%s mode: %v", mode, err)
				continue
			}
			return err
		}
		b.dbs[mode] = d
		b.modes = append(b.modes, mode)
	}
	if len(b.modes) > 0 {
		b.res.Machine.Postgres = pgVersion(ctx, b.dbs[b.modes[0]].pool)
	}
	b.opts.logf("ready: PostgreSQL %s, NATS at %s, modes %v", b.res.Machine.Postgres, b.nats.URL(), b.modes)
	return nil
}

// dropDatabases drops the databases of setUp.
func (b *bench) dropDatabases() {
	for _, d := range b.dbs {
		b.dropDatabase(d)
	}
}

// commitRates measures the single-row commit rate on a plain outbox, then
// with the trigger of capture.poll.notify, for what it costs the
// application (steady phase).
func (b *bench) commitRates(ctx context.Context) error {
	if !b.opts.has("steady") || len(b.modes) == 0 {
		return nil
	}
	d, err := b.newDatabase(ctx, "bench_commit", "poll")
	if err != nil {
		return err
	}
	defer b.dropDatabase(d)
	if err := d.exec(ctx, plainOutboxDDL); err != nil {
		return err
	}
	cr, err := commitRate(ctx, d, b.opts)
	if err != nil {
		return fmt.Errorf("commit rate: %w", err)
	}
	b.res.CommitRate = &cr
	b.opts.logf("single-row commit rate: %.0f/s with %d writers (p50 %.2f ms, p99 %.2f ms)", cr.PerSecond, cr.Writers, cr.Latency.P50, cr.Latency.P99)
	if err := d.exec(ctx, notifyTriggerDDL); err != nil {
		return err
	}
	n, err := measureCommitRate(ctx, d, cr.Writers, b.opts.Payload, b.opts.Aggregates, b.opts.CommitFor)
	if err != nil {
		return fmt.Errorf("commit rate: %w", err)
	}
	b.res.NotifyCommitRate = &n
	b.opts.logf("single-row commit rate with a NOTIFY trigger (capture.poll.notify): %.0f/s with %d writers (p50 %.2f ms, p99 %.2f ms)", n.PerSecond, n.Writers, n.Latency.P50, n.Latency.P99)
	return nil
}

// steadyState measures each mode at the steady loads (steady phase).
func (b *bench) steadyState(ctx context.Context) error {
	if !b.opts.has("steady") || b.res.CommitRate == nil {
		return nil
	}
	for _, mode := range b.modes {
		b.opts.logf("%s steady state: %v of %.0f commits/s, %s each", mode, steadyPercents, b.res.CommitRate.PerSecond, b.opts.Steady)
		st, err := b.measureSteady(ctx, b.dbs[mode], b.res.CommitRate.PerSecond, b.res.CommitRate.Writers)
		b.res.Steady = append(b.res.Steady, st...)
		if err != nil {
			return fmt.Errorf("%s steady state: %w", mode, err)
		}
	}
	return nil
}

// natsDrains drains a backlog per mode into NATS, and again while a
// consumer reads the stream (opts.Consumer). The first also measures the
// pgoutput baseline on its backlog's WAL (drain phase).
func (b *bench) natsDrains(ctx context.Context) error {
	if !b.opts.has("drain") || !slices.Contains(b.opts.Sinks, "nats") {
		return nil
	}
	for _, mode := range drainOrder(b.modes) {
		d := b.dbs[mode]
		before, err := b.pgoutputBefore(ctx, d)
		if err != nil {
			return err
		}
		b.opts.logf("%s drain: inserting %d events over %d aggregates with the relay stopped", mode, b.opts.Events, b.opts.Aggregates)
		note, err := slotNote(ctx, d)
		if err != nil {
			return err
		}
		dr, err := b.measureDrain(ctx, d, b.opts.Relays, nil, before)
		dr.Note = note
		b.res.Drains = append(b.res.Drains, dr)
		if err != nil {
			return fmt.Errorf("%s drain: %w", mode, err)
		}
		if b.opts.Consumer {
			b.opts.logf("%s drain with a consumer reading the stream", mode)
			dr, err := b.consumerDrain(ctx, d)
			b.res.Drains = append(b.res.Drains, dr)
			if err != nil {
				return fmt.Errorf("%s drain with a consumer: %w", mode, err)
			}
		}
	}
	return nil
}

// pgoutputBefore returns what runs between a drain's insert and its relay's
// start to measure the pgoutput baseline on that backlog's WAL, through a
// publication of its own equal to the relay's (inserts on the outbox), so
// that the baseline does not depend on how the relay creates its own; nil
// once the baseline's slot exists.
func (b *bench) pgoutputBefore(ctx context.Context, d *database) (func(context.Context) error, error) {
	if b.rawDone {
		return nil, nil
	}
	const pub = "bench_raw"
	if err := createRawSlot(ctx, d, pub, true); err != nil {
		return nil, err
	}
	b.rawDone = true
	return func(ctx context.Context) error {
		bl, err := b.pgoutputBaseline(ctx, d, pub, b.opts.Events)
		if err == nil {
			b.res.Baselines["pgoutput"] = bl
		}
		return err
	}, nil
}

// slotNote returns a drain's note when relay init did not create wal mode's
// slot in d, empty otherwise.
func slotNote(ctx context.Context, d *database) (string, error) {
	if d.mode != "wal" {
		return "", nil
	}
	var slot bool
	if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, d.slot()).Scan(&slot); err != nil {
		return "", err
	}
	if slot {
		return "", nil
	}
	return "`relay init` did not create the slot: the backlog predates it and may have been drained through the poll path", nil
}

// sinkDrains drains a backlog per mode into each sink of -sinks other
// than NATS: kfake, RabbitMQ, pstest (drain phase).
func (b *bench) sinkDrains(ctx context.Context) error {
	if !b.opts.has("drain") {
		return nil
	}
	for _, snk := range []string{"kafka", "rabbitmq", "pubsub"} {
		if !slices.Contains(b.opts.Sinks, snk) {
			continue
		}
		for _, mode := range drainOrder(b.modes) {
			if err := b.sinkDrain(ctx, mode, snk, b.res); err != nil {
				return err
			}
		}
	}
	return nil
}

// baselines measures the raw DELETE drain, and the pgoutput baseline when
// no NATS drain measured it (baselines phase).
func (b *bench) baselines(ctx context.Context) error {
	if !b.opts.has("baselines") {
		return nil
	}
	d, err := b.newDatabase(ctx, "bench_raw", "poll")
	if err != nil {
		return err
	}
	defer b.dropDatabase(d)
	if err := b.initRelay(ctx, d); err != nil {
		return err
	}
	if !b.rawDone {
		if err := b.pgoutputAlone(ctx, d); err != nil {
			return err
		}
	}
	bl, err := b.deleteBaseline(ctx, d)
	if err != nil {
		return err
	}
	b.res.Baselines["delete"] = bl
	return resetOutbox(ctx, d)
}

// pgoutputAlone measures the pgoutput baseline on a backlog of its own in d.
func (b *bench) pgoutputAlone(ctx context.Context, d *database) error {
	if err := createRawSlot(ctx, d, "bench_raw", true); err != nil {
		return err
	}
	if err := resetOutbox(ctx, d); err != nil {
		return err
	}
	if err := insertBacklog(ctx, d, b.opts.Events, b.opts.Aggregates, b.opts.Payload); err != nil {
		return err
	}
	bl, err := b.pgoutputBaseline(ctx, d, "bench_raw", b.opts.Events)
	if err != nil {
		return err
	}
	b.res.Baselines["pgoutput"] = bl
	return nil
}

// ratios sets every drain's ratio to its baseline.
func (b *bench) ratios(context.Context) error {
	for i := range b.res.Drains {
		setRatio(&b.res.Drains[i], b.res.Baselines)
	}
	return nil
}

// profiles drains once more per mode with this binary as a profiling relay
// (-cpuprofile with the drain phase).
func (b *bench) profiles(ctx context.Context) error {
	if b.opts.ProfileDir == "" || !b.opts.has("drain") {
		return nil
	}
	for _, mode := range b.modes {
		dir := filepath.Join(b.opts.ProfileDir, mode)
		start, err := b.selfRelay(dir)
		if err != nil {
			return err
		}
		b.opts.logf("profile: %s drain with the relay in-process (this binary with -as-relay), profiles to %s", mode, dir)
		dr, err := b.measureDrain(ctx, b.dbs[mode], 1, start, nil)
		dr.Note = joinNote(dr.Note, "profiled: CPU and allocation profiles in "+dir)
		setRatio(&dr, b.res.Baselines)
		b.res.Profiles = append(b.res.Profiles, dr)
		if err != nil {
			return fmt.Errorf("profile drain: %w", err)
		}
	}
	return nil
}

// peakRSS drains large backlogs for the relay's peak RSS (-rss).
func (b *bench) peakRSS(ctx context.Context) error {
	if b.opts.RSSEvents == 0 {
		return nil
	}
	rs, err := b.measureRSS(ctx, b.dbs, b.modes)
	b.res.RSS = rs
	return err
}

// scaling measures the scaling curves (scaling phase).
func (b *bench) scaling(ctx context.Context) error {
	if !b.opts.has("scaling") {
		return nil
	}
	sc, err := b.measureScaling(ctx, b.modes)
	b.res.Scaling = append(b.res.Scaling, sc...)
	return err
}

// plainOutboxDDL is the outbox of docs/reference.md with poll's index and no
// trigger: what the application's commit rate is measured on.
const plainOutboxDDL = testenv.ContractOutbox + `;
CREATE UNIQUE INDEX outbox_relay_seq_idx ON outbox (seq)`

// sinkDrain drains a backlog in mode into snk (kafka, rabbitmq or pubsub),
// in a database of its own; a build that rejects the combination is
// recorded as unavailable.
func (e *env) sinkDrain(ctx context.Context, mode, snk string, res *Results) error {
	d, err := e.newSinkDatabase(ctx, "bench_"+mode+"_"+snk, mode, snk)
	if err != nil {
		return err
	}
	defer e.dropDatabase(d)
	if err := e.initRelay(ctx, d); err != nil {
		if errors.Is(err, errNotAvailable) {
			res.Unavailable[mode+"+"+snk] = err.Error()
			e.opts.logf("%s → %s: %v", mode, snk, err)
			return nil
		}
		return err
	}
	e.opts.logf("%s → %s drain: inserting %d events over %d aggregates with the relay stopped", mode, sinkLabel(snk), e.opts.Events, e.opts.Aggregates)
	dr, err := e.measureDrain(ctx, d, e.opts.Relays, nil, nil)
	res.Drains = append(res.Drains, dr)
	if err != nil {
		return fmt.Errorf("%s → %s drain: %w", mode, snk, err)
	}
	return nil
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// notifyTriggerDDL is the statement-level insert trigger `relay init`
// installs with capture.poll.notify.
const notifyTriggerDDL = `CREATE FUNCTION outbox_relay_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('relay_public_outbox', '');
  RETURN NULL;
END
$fn$;
CREATE TRIGGER outbox_relay_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_relay_notify()`

// drainOrder puts wal first, so that the pgoutput baseline reads the WAL
// of the wal drain's backlog.
func drainOrder(modes []string) []string {
	var out []string
	for _, m := range modes {
		if m == "wal" {
			out = append([]string{m}, out...)
		} else {
			out = append(out, m)
		}
	}
	return out
}

func setRatio(d *DrainResult, b map[string]BaselineResult) {
	if d.Sink != "nats" && d.Sink != "" {
		return // the baselines are for the NATS drains; kfake's figures stand alone
	}
	key := map[string]string{"wal": "pgoutput", "poll": "delete"}[d.Mode]
	if base, ok := b[key]; ok && base.PerSecond > 0 && d.Drain.PerSecond > 0 {
		d.Ratio = d.Drain.PerSecond / base.PerSecond
		d.BaselineOf = base.Name
	}
}

// Target is one performance goal the bench checks, with the measured figure.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Status   string `json:"status"` // met, not met, not measured, not available yet
}

func targets(r *Results) []Target {
	var out []Target
	add := func(name, goal, measured, status string) {
		out = append(out, Target{Name: name, Goal: goal, Measured: measured, Status: status})
	}
	metStr := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	drain := func(mode string) *DrainResult {
		for i := range r.Drains {
			if r.Drains[i].Mode == mode && r.Drains[i].Sink == "nats" {
				return &r.Drains[i]
			}
		}
		return nil
	}
	missing := func(mode string) string {
		if _, ok := r.Unavailable[mode]; ok {
			return "not available yet"
		}
		return "not measured"
	}
	for _, mode := range []string{"wal", "poll"} {
		if drain(mode) == nil {
			add(mode+" drain", "drain ≥ 0.6 × the same-run baseline, relay CPU ≤ 1.0 s per 100,000 events", "-", missing(mode))
		}
	}
	out = append(out, cpuTargets(r)...)
	steady := func(mode string, pct int) *SteadyResult {
		for i := range r.Steady {
			if r.Steady[i].Mode == mode && r.Steady[i].Percent == pct {
				return &r.Steady[i]
			}
		}
		return nil
	}
	out = append(out, latencyTargets(r)...)
	for _, mode := range []string{"wal", "poll"} {
		goal := "lag bounded at 100 % of the commit rate"
		if s := steady(mode, 100); s != nil {
			m := fmt.Sprintf("lag middle %.0f, end %.0f, max %d events; offered %.0f/s, committed %.0f/s; caught up %.2fs after",
				s.LagMiddle, s.LagEnd, s.LagMax, s.TargetRate, s.AchievedRate, s.CatchUpSecs)
			status := metStr(s.Bounded)
			if s.Bounded && s.Saturated {
				status = "met at the committed rate (the offered rate was not reached)"
			}
			add(mode+" lag at 100 %", goal, m, status)
		} else {
			add(mode+" lag at 100 %", goal, "-", missing(mode))
		}
	}
	out = append(out, rssTargets(r)...)
	return out
}

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
			PollNotify: opts.PollNotify, PollInterval: opts.PollInterval.String(), BatchSize: opts.BatchSize}}
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

	// One database per capture mode, each set up by `relay init`.
	dbs := map[string]*database{}
	var modes []string
	for _, mode := range opts.Modes {
		d, err := e.newDatabase(ctx, "bench_"+mode, mode)
		if err != nil {
			return err
		}
		if err := e.initRelay(ctx, d); err != nil {
			e.dropDatabase(d)
			if errors.Is(err, errNotAvailable) {
				res.Unavailable[mode] = err.Error()
				opts.logf("%s mode: %v", mode, err)
				continue
			}
			return err
		}
		dbs[mode] = d
		modes = append(modes, mode)
		defer e.dropDatabase(d)
	}
	if len(modes) > 0 {
		res.Machine.Postgres = pgVersion(ctx, dbs[modes[0]].pool)
	}
	opts.logf("ready: PostgreSQL %s, NATS at %s, modes %v", res.Machine.Postgres, e.nats.URL(), modes)

	if opts.has("steady") && len(modes) > 0 {
		d, err := e.newDatabase(ctx, "bench_commit", "poll")
		if err != nil {
			return err
		}
		if err := d.exec(ctx, plainOutboxDDL); err != nil {
			return err
		}
		cr, err := commitRate(ctx, d, opts)
		if err != nil {
			e.dropDatabase(d)
			return fmt.Errorf("commit rate: %w", err)
		}
		res.CommitRate = &cr
		opts.logf("single-row commit rate: %.0f/s with %d writers (p50 %.2f ms, p99 %.2f ms)", cr.PerSecond, cr.Writers, cr.Latency.P50, cr.Latency.P99)
		// The same with the trigger of capture.poll.notify, for what it
		// costs the application.
		if err := d.exec(ctx, notifyTriggerDDL); err != nil {
			e.dropDatabase(d)
			return err
		}
		n, err := measureCommitRate(ctx, d, cr.Writers, opts.Payload, opts.Aggregates, opts.CommitFor)
		e.dropDatabase(d)
		if err != nil {
			return fmt.Errorf("commit rate: %w", err)
		}
		res.NotifyCommitRate = &n
		opts.logf("single-row commit rate with a NOTIFY trigger (capture.poll.notify): %.0f/s with %d writers (p50 %.2f ms, p99 %.2f ms)", n.PerSecond, n.Writers, n.Latency.P50, n.Latency.P99)
	}

	// The steady state runs before the drains: a wal slot that sat idle
	// while the drains wrote gigabytes of WAL in other databases would have
	// to decode through all of it first.
	if opts.has("steady") && res.CommitRate != nil {
		for _, mode := range modes {
			opts.logf("%s steady state: %v of %.0f commits/s, %s each", mode, steadyPercents, res.CommitRate.PerSecond, opts.Steady)
			st, err := e.measureSteady(ctx, dbs[mode], res.CommitRate.PerSecond, res.CommitRate.Writers)
			res.Steady = append(res.Steady, st...)
			if err != nil {
				return fmt.Errorf("%s steady state: %w", mode, err)
			}
		}
	}

	natsDrains := opts.has("drain") && slices.Contains(opts.Sinks, "nats")
	// The pgoutput baseline decodes the WAL of the wal drain's backlog, with
	// the relay's publication; without wal mode, the poll backlog's with a
	// publication of its own.
	rawDone := !opts.has("baselines")
	if natsDrains {
		for _, mode := range drainOrder(modes) {
			d := dbs[mode]
			var before func(context.Context) error
			if !rawDone {
				// A publication of its own, equal to the relay's (inserts on
				// the outbox), so that the baseline does not depend on how
				// the relay creates its own.
				pub := "bench_raw"
				if err := createRawSlot(ctx, d, pub, true); err != nil {
					return err
				}
				rawDone = true
				before = func(ctx context.Context) error {
					b, err := e.pgoutputBaseline(ctx, d, pub, opts.Events)
					if err == nil {
						res.Baselines["pgoutput"] = b
					}
					return err
				}
			}
			opts.logf("%s drain: inserting %d events over %d aggregates with the relay stopped", mode, opts.Events, opts.Aggregates)
			note := ""
			if mode == "wal" {
				var slot bool
				if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, d.slot()).Scan(&slot); err != nil {
					return err
				}
				if !slot {
					note = "`relay init` did not create the slot: the backlog predates it and may have been drained through the poll path"
					opts.logf("wal: %s", note)
				}
			}
			dr, err := e.measureDrain(ctx, d, opts.Relays, nil, before)
			dr.Note = note
			res.Drains = append(res.Drains, dr)
			if err != nil {
				return fmt.Errorf("%s drain: %w", mode, err)
			}
			if opts.Consumer {
				opts.logf("%s drain with a consumer reading the stream", mode)
				dr, err := e.consumerDrain(ctx, d)
				res.Drains = append(res.Drains, dr)
				if err != nil {
					return fmt.Errorf("%s drain with a consumer: %w", mode, err)
				}
			}
		}
	}
	if opts.has("drain") && slices.Contains(opts.Sinks, "kafka") {
		for _, mode := range drainOrder(modes) {
			if err := e.kafkaDrain(ctx, mode, res); err != nil {
				return err
			}
		}
	}
	if opts.has("baselines") {
		d, err := e.newDatabase(ctx, "bench_raw", "poll")
		if err != nil {
			return err
		}
		defer e.dropDatabase(d)
		if err := e.initRelay(ctx, d); err != nil {
			return err
		}
		if !rawDone {
			if err := createRawSlot(ctx, d, "bench_raw", true); err != nil {
				return err
			}
			if err := resetOutbox(ctx, d); err != nil {
				return err
			}
			if err := insertBacklog(ctx, d, opts.Events, opts.Aggregates, opts.Payload); err != nil {
				return err
			}
			b, err := e.pgoutputBaseline(ctx, d, "bench_raw", opts.Events)
			if err != nil {
				return err
			}
			res.Baselines["pgoutput"] = b
		}
		b, err := e.deleteBaseline(ctx, d)
		if err != nil {
			return err
		}
		res.Baselines["delete"] = b
		if err := resetOutbox(ctx, d); err != nil {
			return err
		}
	}
	for i := range res.Drains {
		setRatio(&res.Drains[i], res.Baselines)
	}

	if opts.ProfileDir != "" {
		for _, mode := range modes {
			dir := filepath.Join(opts.ProfileDir, mode)
			start, err := e.selfRelay(dir)
			if err != nil {
				return err
			}
			opts.logf("profile: %s drain with the relay in-process (this binary with -as-relay), profiles to %s", mode, dir)
			dr, err := e.measureDrain(ctx, dbs[mode], 1, start, nil)
			dr.Note = joinNote(dr.Note, "profiled: CPU and allocation profiles in "+dir)
			setRatio(&dr, res.Baselines)
			res.Profiles = append(res.Profiles, dr)
			if err != nil {
				return fmt.Errorf("profile drain: %w", err)
			}
		}
	}

	if opts.RSSEvents > 0 {
		rs, err := e.measureRSS(ctx, dbs, modes)
		res.RSS = rs
		if err != nil {
			return err
		}
	}

	if opts.has("scaling") {
		sc, err := e.measureScaling(ctx, modes)
		res.Scaling = append(res.Scaling, sc...)
		if err != nil {
			return err
		}
	}

	return nil
}

// plainOutboxDDL is the outbox of docs/reference.md with poll's index and no
// trigger: what the application's commit rate is measured on.
const plainOutboxDDL = testenv.ContractOutbox + `;
CREATE INDEX outbox_relay_seq_idx ON outbox (seq)`

// kafkaDrain drains a backlog in mode into kfake, in a database of its
// own; a build that rejects the combination is recorded as unavailable.
func (e *env) kafkaDrain(ctx context.Context, mode string, res *Results) error {
	d, err := e.newSinkDatabase(ctx, "bench_"+mode+"_kafka", mode, "kafka")
	if err != nil {
		return err
	}
	defer e.dropDatabase(d)
	if err := e.initRelay(ctx, d); err != nil {
		if errors.Is(err, errNotAvailable) {
			res.Unavailable[mode+"+kafka"] = err.Error()
			e.opts.logf("%s → kafka: %v", mode, err)
			return nil
		}
		return err
	}
	e.opts.logf("%s → kfake drain: inserting %d events over %d aggregates with the relay stopped", mode, e.opts.Events, e.opts.Aggregates)
	dr, err := e.measureDrain(ctx, d, e.opts.Relays, nil, nil)
	res.Drains = append(res.Drains, dr)
	if err != nil {
		return fmt.Errorf("%s → kafka drain: %w", mode, err)
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

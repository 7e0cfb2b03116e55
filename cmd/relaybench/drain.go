package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// DrainResult is one backlog drain by the relay.
type DrainResult struct {
	Mode      string `json:"mode"`
	Sink      string `json:"sink"`
	Relays    int    `json:"relays"`
	Available bool   `json:"available"`
	Note      string `json:"note,omitempty"`
	Complete  bool   `json:"complete"` // every event archived before the timeout
	// Insert is the COPY of the backlog, with the relay stopped.
	Insert rate `json:"insert"`
	// Drain runs from the relay's process start until its
	// relay_events_archived_total reached the backlog size: every event
	// published, acknowledged by the broker and deleted from the outbox.
	Drain rate `json:"drain"`
	// Ratio is Drain's rate over the baseline's: pgoutput decode for wal,
	// raw DELETE drain for poll.
	Ratio      float64 `json:"ratio_to_baseline,omitempty"`
	BaselineOf string  `json:"baseline,omitempty"`
	// PeakRSSMB is the relay's VmHWM at the end of the drain (the largest of
	// the relays with several).
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// CPUSeconds is the relay's utime+stime (summed over relays);
	// CPUPer100k scales it to 100,000 events.
	CPUSeconds       float64 `json:"relay_cpu_seconds"`
	CPUPer100k       float64 `json:"relay_cpu_seconds_per_100k_events"`
	CPU              cpuUse  `json:"machine"`
	Published        int64   `json:"published"`     // relay_events_published_total
	StreamMessages   uint64  `json:"sink_messages"` // messages in the stream, records in the topics
	OutboxEmpty      bool    `json:"outbox_empty"`
	FirstPublishSecs float64 `json:"first_archive_seconds"` // from start to the first archived event
	// Mallocs is the relay's go_memstats_mallocs_total at the end (summed
	// over relays), startup and metric scrapes included; AllocsPerEvent
	// divides it by the events archived.
	Mallocs        float64 `json:"relay_mallocs"`
	AllocsPerEvent float64 `json:"relay_allocs_per_event"`
	// Consumer is set when a consumer read the stream during the drain;
	// ConsumerReceived is what it got, ConsumerCatchUpSecs how long after
	// the drain it took to get all.
	Consumer            bool    `json:"consumer,omitempty"`
	ConsumerReceived    int64   `json:"consumer_received,omitempty"`
	ConsumerCatchUpSecs float64 `json:"consumer_catch_up_seconds,omitempty"`
	// Progress is relay_events_archived_total once a second.
	Progress []progressPoint `json:"progress"`
	Log      string          `json:"relay_log,omitempty"`
}

type progressPoint struct {
	Seconds  float64 `json:"t"`
	Archived int64   `json:"archived"`
	// CPU seconds since the relay started.
	Relay    float64 `json:"relay_cpu"`
	Postgres float64 `json:"postgres_cpu"`
	Bench    float64 `json:"bench_cpu"`
	Other    float64 `json:"other_cpu"`
}

// drainTimeout bounds one drain.
func drainTimeout(n int) time.Duration {
	return max(2*time.Minute, time.Duration(n)*time.Millisecond/2)
}

// relayStarter starts one relay for database d; the default starts `relay
// run` from the built binary.
type relayStarter func(d *database, tag string) (*relayProc, error)

// measureDrain inserts a backlog of opts.Events into d with the relay
// stopped, then starts relays and times the drain. before runs after the
// insert and before the relay starts (the pgoutput baseline reads the
// backlog's WAL then).
func (e *env) measureDrain(ctx context.Context, d *database, relays int, start relayStarter,
	before func(context.Context) error) (DrainResult, error) {
	res := DrainResult{Mode: d.mode, Sink: d.sink, Relays: relays, Available: true}
	sinkBefore, err := e.prepareDrain(ctx, d, &res, before)
	if err != nil {
		return res, err
	}
	if start == nil {
		start = e.startRelay
	}
	cpu0 := sampleCPU()
	procs := make([]*relayProc, 0, relays)
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for i := range relays {
		p, err := start(d, fmt.Sprintf("drain-%s-%d", d.mode, i))
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	archived, err := e.waitDrained(ctx, d, procs, cpu0, &res)
	if err != nil {
		return res, err
	}
	if err := relayFigures(procs, archived, cpu0, &res); err != nil {
		return res, err
	}
	for _, p := range procs {
		if err := p.stop(); err != nil {
			e.opts.logf("%s: %v", d.mode, err)
		}
	}
	procs = nil
	return res, e.checkDrained(ctx, d, sinkBefore, archived, &res)
}

// prepareDrain empties d's outbox, moves wal mode's idle slot past other
// databases' WAL, inserts the backlog, runs before and readies the backlog
// as a production table would be. It returns the sink's message count
// before the drain (Kafka: records in the topics; NATS: the stream is
// deleted, so 0).
func (e *env) prepareDrain(ctx context.Context, d *database, res *DrainResult, before func(context.Context) error) (uint64, error) {
	o := e.opts
	if err := resetOutbox(ctx, d); err != nil {
		return 0, err
	}
	if err := e.advanceIdleSlot(ctx, d); err != nil {
		return 0, err
	}
	var sinkBefore uint64
	if d.sink == "nats" {
		e.deleteStream(ctx)
	} else {
		var err error
		if sinkBefore, err = e.sinkCount(ctx, d); err != nil {
			return 0, err
		}
	}
	t0 := time.Now()
	if err := insertBacklog(ctx, d, o.Events, o.Aggregates, o.Payload); err != nil {
		return 0, err
	}
	res.Insert = newRate(int64(o.Events), time.Since(t0))
	o.logf("%s: inserted %d events in %.1fs (%.0f/s)", d.mode, o.Events, res.Insert.Seconds, res.Insert.PerSecond)
	if before != nil {
		if err := before(ctx); err != nil {
			return 0, err
		}
	}
	return sinkBefore, prepareBacklog(ctx, d)
}

// advanceIdleSlot moves the relay's slot in wal mode past WAL other
// databases wrote since it last ran (earlier drains): nothing in it concerns
// this outbox, which is empty, so the drain decodes only its own backlog.
func (e *env) advanceIdleSlot(ctx context.Context, d *database) error {
	if d.mode != "wal" {
		return nil
	}
	t := time.Now()
	var ok bool
	err := d.pool.QueryRow(ctx, `SELECT count(pg_replication_slot_advance(slot_name, pg_current_wal_lsn())) > 0
		FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, d.slot()).Scan(&ok)
	if err != nil {
		return fmt.Errorf("advance slot %s: %w", d.slot(), err)
	}
	if el := time.Since(t); el > time.Second {
		e.opts.logf("%s: moved slot %s past other databases' WAL in %.1fs", d.mode, d.slot(), el.Seconds())
	}
	return nil
}

// waitDrained polls the relays' metrics every 100 ms until they archived
// the backlog or the drain timed out, recording progress once a second and
// the drain's rate in res. It returns the events archived.
func (e *env) waitDrained(ctx context.Context, d *database, procs []*relayProc, cpu0 cpuSample, res *DrainResult) (int64, error) {
	began := procs[0].started
	want := int64(e.opts.Events)
	deadline := began.Add(drainTimeout(e.opts.Events))
	nextProgress := began.Add(time.Second)
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		now := time.Now()
		archived, published, err := drainCounts(procs, res)
		if err != nil {
			return 0, err
		}
		res.Published = published
		if archived > 0 && res.FirstPublishSecs == 0 {
			res.FirstPublishSecs = now.Sub(began).Seconds()
		}
		if !now.Before(nextProgress) {
			res.Progress = append(res.Progress, progressAt(now.Sub(began), archived, procs, cpu0))
			nextProgress = nextProgress.Add(time.Second)
		}
		if archived >= want || now.After(deadline) {
			res.Complete = archived >= want
			if !res.Complete {
				e.opts.logf("%s: drain timed out after %s with %d of %d archived", d.mode, now.Sub(began).Round(time.Second), archived, want)
			}
			res.Drain = newRate(archived, now.Sub(began))
			return archived, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// drainCounts sums the relays' archived and published events; a relay that
// exited fails the drain with its log's tail in res.
func drainCounts(procs []*relayProc, res *DrainResult) (archived, published int64, err error) {
	for _, p := range procs {
		if err := p.exited(); err != nil {
			res.Log = tail(p.logPath, 30)
			return 0, 0, err
		}
		m, err := p.metrics()
		if err != nil {
			continue // not listening yet
		}
		archived += int64(m["relay_events_archived_total"])
		published += int64(m["relay_events_published_total"])
	}
	return archived, published, nil
}

// progressAt is the drain's progress point at elapsed: archived events and
// the CPU seconds of the relays, Postgres, the bench and others since cpu0.
func progressAt(elapsed time.Duration, archived int64, procs []*relayProc, cpu0 cpuSample) progressPoint {
	var relayCPU float64
	for _, p := range procs {
		ps, _ := readProcStats(p.cmd.Process.Pid)
		relayCPU += ps.CPUSeconds
	}
	u := cpuBetween(cpu0, sampleCPU(), relayCPU)
	return progressPoint{Seconds: elapsed.Seconds(), Archived: archived,
		Relay: relayCPU, Postgres: u.PostgresSeconds, Bench: u.BenchSeconds, Other: u.OtherSeconds}
}

// relayFigures records the relays' allocations, peak RSS and CPU, and the
// machine's CPU split since cpu0, in res.
func relayFigures(procs []*relayProc, archived int64, cpu0 cpuSample, res *DrainResult) error {
	for _, p := range procs {
		if m, err := p.metrics(); err == nil {
			res.Mallocs += m["go_memstats_mallocs_total"]
		}
		ps, err := readProcStats(p.cmd.Process.Pid)
		if err != nil {
			return err
		}
		res.PeakRSSMB = max(res.PeakRSSMB, float64(ps.PeakRSSBytes)/(1<<20))
		res.CPUSeconds += ps.CPUSeconds
	}
	res.CPU = cpuBetween(cpu0, sampleCPU(), res.CPUSeconds)
	if archived > 0 {
		res.AllocsPerEvent = res.Mallocs / float64(archived)
		res.CPUPer100k = res.CPUSeconds * 100_000 / float64(archived)
	}
	return nil
}

// checkDrained checks, after the relays stopped, that a complete drain left
// the outbox empty and the sink holding every event, and logs the drain.
func (e *env) checkDrained(ctx context.Context, d *database, sinkBefore uint64, archived int64, res *DrainResult) error {
	if err := d.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM outbox)").Scan(&res.OutboxEmpty); err != nil {
		return err
	}
	if n, err := e.sinkCount(ctx, d); err == nil {
		res.StreamMessages = n - sinkBefore
	}
	e.opts.logf("%s → %s: drained %d events in %.1fs: %.0f events/s, peak RSS %.0f MB, relay CPU %.1fs (%.2fs per 100k), machine busy %.0f%%, the sink holds %d",
		d.mode, d.sink, archived, res.Drain.Seconds, res.Drain.PerSecond, res.PeakRSSMB, res.CPUSeconds, res.CPUPer100k,
		res.CPU.MachineBusyPercent, res.StreamMessages)
	if res.Complete && (!res.OutboxEmpty || res.StreamMessages < uint64(e.opts.Events)) {
		return fmt.Errorf("%s drain: archived %d events but outbox empty=%v and the sink holds %d",
			d.mode, archived, res.OutboxEmpty, res.StreamMessages)
	}
	return nil
}

// BaselineResult is one of the database's own limits.
type BaselineResult struct {
	Name string `json:"name"`
	What string `json:"what"`
	rate
	CPU  cpuUse `json:"machine"`
	Note string `json:"note,omitempty"`
}

// rawSlot is the logical slot pg_recvlogical reads.
const rawSlot = "bench_pgoutput"

// createRawSlot creates the pgoutput slot of the decode baseline in d,
// with publication pub (created when create is set).
func createRawSlot(ctx context.Context, d *database, pub string, create bool) error {
	if create {
		if err := d.exec(ctx, fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')`, pub)); err != nil {
			return err
		}
	}
	return d.exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, rawSlot)
}

// pgoutputBaseline times pg_recvlogical decoding the slot's WAL up to the
// current position to /dev/null; events is how many outbox inserts that
// WAL holds.
func (e *env) pgoutputBaseline(ctx context.Context, d *database, pub string, events int) (BaselineResult, error) {
	res := BaselineResult{Name: "pgoutput decode",
		What: "pg_recvlogical --start --no-loop -f /dev/null --endpos=<LSN after the insert> (pgoutput proto_version=1), the same WAL"}
	endpos, err := d.currentLSN(ctx)
	if err != nil {
		return res, err
	}
	args := append(recvlogicalArgs(d.dsn, rawSlot, pub, 10), "--no-loop", "--endpos", endpos)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(rctx, filepath.Join(e.pgBin, "pg_recvlogical"), args...)
	cpu0 := sampleCPU()
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	el := time.Since(t0)
	// Let the postmaster reap the walsender, so that its CPU time shows in
	// the postmaster's children.
	time.Sleep(300 * time.Millisecond)
	res.CPU = cpuBetween(cpu0, sampleCPU(), 0)
	if err != nil {
		return res, fmt.Errorf("pg_recvlogical: %w\n%s", err, out)
	}
	res.rate = newRate(int64(events), el)
	if err := d.exec(ctx, `SELECT pg_drop_replication_slot($1)`, rawSlot); err != nil {
		e.opts.logf("drop slot %s: %v", rawSlot, err)
	}
	e.opts.logf("baseline pgoutput decode: %d events in %.2fs: %.0f events/s", events, el.Seconds(), res.PerSecond)
	return res, nil
}

// deleteBaseline inserts a fresh backlog into d and drains it with
// rawDelete by id in batches of 1,000 from one connection, reading every
// returned row.
func (e *env) deleteBaseline(ctx context.Context, d *database) (BaselineResult, error) {
	o := e.opts
	res := BaselineResult{Name: "raw DELETE drain", What: "DELETE … ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED RETURNING *, one connection, autocommit"}
	if err := resetOutbox(ctx, d); err != nil {
		return res, err
	}
	if err := insertBacklog(ctx, d, o.Events, o.Aggregates, o.Payload); err != nil {
		return res, err
	}
	if err := prepareBacklog(ctx, d); err != nil {
		return res, err
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Release()
	cpu0 := sampleCPU()
	t0 := time.Now()
	var total int64
	var bytes int
	query := rawDelete("id", 1000)
	for {
		n, b, err := deleteBatch(ctx, conn, query)
		if err != nil {
			return res, err
		}
		total, bytes = total+int64(n), bytes+b
		if n == 0 {
			break
		}
	}
	el := time.Since(t0)
	res.CPU = cpuBetween(cpu0, sampleCPU(), 0)
	res.rate = newRate(total, el)
	o.logf("baseline raw DELETE drain: %d events (%d MB returned) in %.1fs: %.0f events/s", total, bytes>>20, el.Seconds(), res.PerSecond)
	if total != int64(o.Events) {
		return res, fmt.Errorf("raw DELETE drain removed %d rows, want %d", total, o.Events)
	}
	return res, nil
}

// selfRelay returns a relayStarter that runs the relay inside this
// program's own binary (re-executed with -as-relay) with CPU and
// allocation profiles written to dir: a process that holds only the relay,
// like `relay run`.
func (e *env) selfRelay(dir string) (relayStarter, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return func(d *database, tag string) (*relayProc, error) {
		path, port, err := d.configCopy(tag)
		if err != nil {
			return nil, err
		}
		return e.startProc(tag, port, exe, "-as-relay", path, "-as-relay-profile", dir)
	}, nil
}

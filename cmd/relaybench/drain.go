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
	o := e.opts
	res := DrainResult{Mode: d.mode, Sink: d.sink, Relays: relays, Available: true}
	if err := resetOutbox(ctx, d); err != nil {
		return res, err
	}
	if d.mode == "wal" {
		// The relay's slot may sit behind WAL other databases wrote since it
		// last ran (earlier drains); nothing in it concerns this outbox,
		// which is empty. Move the slot past it so the drain decodes only
		// its own backlog.
		t := time.Now()
		var ok bool
		err := d.pool.QueryRow(ctx, `SELECT count(pg_replication_slot_advance(slot_name, pg_current_wal_lsn())) > 0
			FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, d.slot()).Scan(&ok)
		if err != nil {
			return res, fmt.Errorf("advance slot %s: %w", d.slot(), err)
		}
		if el := time.Since(t); el > time.Second {
			o.logf("%s: moved slot %s past other databases' WAL in %.1fs", d.mode, d.slot(), el.Seconds())
		}
	}
	var before0 uint64
	if d.sink == "kafka" {
		var err error
		if before0, err = e.kafkaRecords(ctx); err != nil {
			return res, err
		}
	} else {
		e.deleteStream(ctx)
	}
	t0 := time.Now()
	if err := insertBacklog(ctx, d, o.Events, o.Aggregates, o.Payload); err != nil {
		return res, err
	}
	res.Insert = newRate(int64(o.Events), time.Since(t0))
	o.logf("%s: inserted %d events in %.1fs (%.0f/s)", d.mode, o.Events, res.Insert.Seconds, res.Insert.PerSecond)
	if before != nil {
		if err := before(ctx); err != nil {
			return res, err
		}
	}
	if err := prepareBacklog(ctx, d); err != nil {
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
	began := procs[0].started
	want := int64(o.Events)
	deadline := began.Add(drainTimeout(o.Events))
	nextProgress := began.Add(time.Second)
	var archived, published int64
	var done time.Time
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		now := time.Now()
		archived, published = 0, 0
		for _, p := range procs {
			if err := p.exited(); err != nil {
				res.Log = tail(p.logPath, 30)
				return res, err
			}
			m, err := p.metrics()
			if err != nil {
				continue // not listening yet
			}
			archived += int64(m["relay_events_archived_total"])
			published += int64(m["relay_events_published_total"])
		}
		if archived > 0 && res.FirstPublishSecs == 0 {
			res.FirstPublishSecs = now.Sub(began).Seconds()
		}
		if !now.Before(nextProgress) {
			var relayCPU float64
			for _, p := range procs {
				ps, _ := readProcStats(p.cmd.Process.Pid)
				relayCPU += ps.CPUSeconds
			}
			u := cpuBetween(cpu0, sampleCPU(), relayCPU)
			res.Progress = append(res.Progress, progressPoint{Seconds: now.Sub(began).Seconds(), Archived: archived,
				Relay: relayCPU, Postgres: u.PostgresSeconds, Bench: u.BenchSeconds, Other: u.OtherSeconds})
			nextProgress = nextProgress.Add(time.Second)
		}
		if archived >= want {
			done = now
			res.Complete = true
			break
		}
		if now.After(deadline) {
			done = now
			o.logf("%s: drain timed out after %s with %d of %d archived", d.mode, now.Sub(began).Round(time.Second), archived, want)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.Drain = newRate(archived, done.Sub(began))
	res.Published = published
	for _, p := range procs {
		if m, err := p.metrics(); err == nil {
			res.Mallocs += m["go_memstats_mallocs_total"]
		}
	}
	if archived > 0 {
		res.AllocsPerEvent = res.Mallocs / float64(archived)
	}
	for _, p := range procs {
		ps, err := readProcStats(p.cmd.Process.Pid)
		if err != nil {
			return res, err
		}
		res.PeakRSSMB = max(res.PeakRSSMB, float64(ps.PeakRSSBytes)/(1<<20))
		res.CPUSeconds += ps.CPUSeconds
	}
	res.CPU = cpuBetween(cpu0, sampleCPU(), res.CPUSeconds)
	if archived > 0 {
		res.CPUPer100k = res.CPUSeconds * 100_000 / float64(archived)
	}
	for _, p := range procs {
		if err := p.stop(); err != nil {
			o.logf("%s: %v", d.mode, err)
		}
	}
	procs = nil
	if err := d.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM outbox)").Scan(&res.OutboxEmpty); err != nil {
		return res, err
	}
	if n, err := e.sinkCount(ctx, d); err == nil {
		res.StreamMessages = n - before0
	}
	o.logf("%s → %s: drained %d events in %.1fs: %.0f events/s, peak RSS %.0f MB, relay CPU %.1fs (%.2fs per 100k), machine busy %.0f%%, the sink holds %d",
		d.mode, d.sink, archived, res.Drain.Seconds, res.Drain.PerSecond, res.PeakRSSMB, res.CPUSeconds, res.CPUPer100k,
		res.CPU.MachineBusyPercent, res.StreamMessages)
	if res.Complete && (!res.OutboxEmpty || res.StreamMessages < uint64(want)) {
		return res, fmt.Errorf("%s drain: archived %d events but outbox empty=%v and the sink holds %d",
			d.mode, archived, res.OutboxEmpty, res.StreamMessages)
	}
	return res, nil
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
	args := []string{"-d", d.dsn, "--slot", rawSlot, "--start", "--no-loop", "-f", "/dev/null",
		"-F", "0", "-s", "10", "--endpos", endpos,
		"-o", "proto_version=1", "-o", "publication_names=" + pub}
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

// rawDeleteQuery is the poll baseline: what a minimal poller does per batch.
const rawDeleteQuery = `DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY seq LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING *`

// deleteBaseline inserts a fresh backlog into d and drains it with
// rawDeleteQuery from one connection, reading every returned row.
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
	for {
		rows, err := conn.Query(ctx, rawDeleteQuery)
		if err != nil {
			return res, err
		}
		n := 0
		for rows.Next() {
			for _, v := range rows.RawValues() {
				bytes += len(v)
			}
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return res, err
		}
		total += int64(n)
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

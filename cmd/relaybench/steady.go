package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/nats-io/nats.go/jetstream"
)

// CommitRate is the single-row commit rate of the database, measured with
// the relay stopped: the best of Sweep.
type CommitRate struct {
	Writers int `json:"writers"`
	rate
	Latency Percentiles  `json:"commit_latency"`
	Sweep   []CommitRate `json:"sweep,omitempty"`
}

// writerSweep are the writer counts tried when -writers is 0: on this
// 2-core machine, more than ~16 writers commit less, not more.
var writerSweep = []int{4, 8, 16, 32}

// commitRate measures the commit rate with opts.Writers writers, or with
// each count of writerSweep, returning the best.
func commitRate(ctx context.Context, d *database, o Options) (CommitRate, error) {
	counts := writerSweep
	if o.Writers > 0 {
		counts = []int{o.Writers}
	}
	var best CommitRate
	var sweep []CommitRate
	for _, w := range counts {
		cr, err := measureCommitRate(ctx, d, w, o.Payload, o.Aggregates, o.CommitFor)
		if err != nil {
			return best, err
		}
		o.logf("commit rate with %d writers: %.0f/s (p50 %.2f ms, p99 %.2f ms)", w, cr.PerSecond, cr.Latency.P50, cr.Latency.P99)
		sweep = append(sweep, cr)
		if cr.PerSecond > best.PerSecond {
			best = cr
		}
	}
	if len(sweep) > 1 {
		best.Sweep = sweep
	}
	return best, nil
}

// measureCommitRate runs writers goroutines committing single-row INSERT
// transactions into d's outbox as fast as they can for dur, then empties
// the outbox.
func measureCommitRate(ctx context.Context, d *database, writers int, payload, aggregates int, dur time.Duration) (CommitRate, error) {
	res := CommitRate{Writers: writers}
	if err := resetOutbox(ctx, d); err != nil {
		return res, err
	}
	errs := make(chan error, writers)
	// Warm the connections and the statement cache first.
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			if err := insertEvent(ctx, d, rng, 0xffffffff, w, aggregates, payload); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	n, el, hist, err := closedLoop(writers, 11, dur, func(w int, rng *rand.Rand, i int) error {
		return insertEvent(ctx, d, rng, 0xfffffffe, i, aggregates, payload)
	})
	if err != nil {
		return res, err
	}
	res.rate = newRate(n, el)
	res.Latency = hist.summary()
	return res, resetOutbox(ctx, d)
}

// closedLoop runs workers goroutines, each calling do with its index, a
// random source seeded with seed and a count, as fast as it can for dur. It
// returns the calls made, the time taken, their latencies and the first
// error, which stops its worker.
func closedLoop(workers int, seed uint64, dur time.Duration, do func(w int, rng *rand.Rand, i int) error) (int64, time.Duration, histogram, error) {
	var count atomic.Int64
	var mu sync.Mutex
	var hist histogram
	errs := make(chan error, workers)
	start := time.Now()
	stop := start.Add(dur)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			var local histogram
			for i := 0; time.Now().Before(stop); i++ {
				t := time.Now()
				if err := do(w, rng, i); err != nil {
					errs <- err
					return
				}
				local.record(time.Since(t))
				count.Add(1)
			}
			mu.Lock()
			hist.merge(&local)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	return count.Load(), el, hist, <-errs
}

// insertEvent commits one single-row transaction (autocommit INSERT).
func insertEvent(ctx context.Context, d *database, rng *rand.Rand, tag uint32, idx, aggregates, payload int) error {
	agg := rng.IntN(aggregates)
	id := benchID(tag, idx, rng)
	_, err := d.pool.Exec(ctx, insertOne, pgtype.UUID{Bytes: id, Valid: true}, aggType, aggregateID(agg), "step",
		payloadFor(agg, idx, payload), eventHeaders)
	return err
}

func (h *histogram) merge(o *histogram) {
	if o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
	for e := range o.counts {
		for s, c := range o.counts[e] {
			h.counts[e][s] += c
		}
	}
}

// SteadyResult is one open-loop rate in one capture mode.
type SteadyResult struct {
	Mode           string  `json:"mode"`
	Percent        int     `json:"percent_of_commit_rate"`
	TargetRate     float64 `json:"target_events_per_second"`
	Seconds        float64 `json:"seconds"`
	Scheduled      int     `json:"scheduled"`
	Committed      int64   `json:"committed"`
	Received       int64   `json:"received"` // distinct message_ids the consumer got
	Duplicates     int64   `json:"duplicates"`
	AchievedRate   float64 `json:"achieved_commit_rate"`    // commits per second while the schedule ran
	ProducerBehind int64   `json:"producer_backlog_at_end"` // scheduled but not yet committed when the schedule ended
	// Dropped events were not committed within a grace period after the
	// schedule's end and were abandoned; Saturated is set when the database
	// committed less than 95 % of the offered load (the latencies then
	// measure the database's queue more than the relay).
	Dropped   int64 `json:"dropped"`
	Saturated bool  `json:"saturated"`
	// Latencies from the intended send time (open loop: no coordinated
	// omission) and from the commit as the writer saw it, to the broker's
	// acknowledgement (the JetStream stream's store timestamp of the
	// message) and to the consumer's receipt (a JetStream ordered consumer
	// in this process).
	SendToAck     Percentiles `json:"send_to_ack"`
	SendToReceipt Percentiles `json:"send_to_receipt"`
	CommitToAck   Percentiles `json:"commit_to_ack"`
	CommitToRecv  Percentiles `json:"commit_to_receipt"`
	SendToCommit  Percentiles `json:"send_to_commit"`
	// Decoder is the latency baseline of the same events: from the
	// writer's commit to their receipt by a minimal pgoutput reader on a
	// slot of its own (decodeReader).
	Decoder Percentiles `json:"commit_to_decoder_receipt"`
	// Lag is committed minus received events: its mean around the middle
	// (40–60 % of the run) and at the end (90–100 %), its maximum, and
	// whether it stayed bounded (end ≤ 1.5 × middle + a quarter second of
	// events).
	LagMiddle   float64     `json:"lag_middle"`
	LagEnd      float64     `json:"lag_end"`
	LagMax      int64       `json:"lag_max"`
	Bounded     bool        `json:"lag_bounded"`
	CatchUpSecs float64     `json:"catch_up_seconds"` // from the end of the schedule until every committed event was received
	Samples     []lagSample `json:"samples"`
	// From the relay's start, and from its /readyz turning ready, to the
	// first event of the warm-up received (its first was sent right after
	// ready).
	RelayStartToFirstReceipt float64 `json:"relay_start_to_first_receipt_seconds"`
	ReadyToFirstReceipt      float64 `json:"ready_to_first_receipt_seconds"`
	firstReceipt             int64
	start                    time.Time
	RelayCPU                 float64 `json:"relay_cpu_seconds"`
	RelayRSSMB               float64 `json:"relay_rss_mb"`
	CPU                      cpuUse  `json:"machine"`
}

type lagSample struct {
	Seconds   float64 `json:"t"`
	Scheduled int64   `json:"scheduled"`
	Committed int64   `json:"committed"`
	Received  int64   `json:"received"`
}

// schedule is one open-loop run: event i is due at start + i/rate.
type schedule struct {
	tag      uint32
	n        int
	start    time.Time
	period   float64 // nanoseconds between events
	commitAt []atomic.Int64
	dropped  []atomic.Bool
	ackAt    []atomic.Int64
	recvAt   []atomic.Int64
	readAt   []atomic.Int64 // receipt by the decodeReader, the latency baseline
	sent     atomic.Int64
	commits  atomic.Int64
	received atomic.Int64
	reads    atomic.Int64 // events the decodeReader received
	dups     atomic.Int64
	drops    atomic.Int64
}

func (s *schedule) due(i int) time.Time {
	return s.start.Add(time.Duration(float64(i) * s.period))
}

// receiver is the consumer: it matches each message to its schedule by the
// tag in its message_id.
type receiver struct {
	cur    atomic.Pointer[schedule]
	cc     jetstream.ConsumeContext
	bad    atomic.Int64
	reader *decodeReader // reads the same schedule from a slot of its own; nil: none
}

func (e *env) startReceiver(ctx context.Context) (*receiver, error) {
	r := &receiver{}
	oc, err := e.js.OrderedConsumer(ctx, benchStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		return nil, err
	}
	r.cc, err = oc.Consume(r.handle)
	return r, err
}

func (r *receiver) handle(m jetstream.Msg) {
	now := time.Now().UnixNano()
	s := r.cur.Load()
	if s == nil {
		return
	}
	tag, idx, ok := parseBenchID(m.Headers().Get("message_id"))
	if !ok || tag != s.tag || idx < 0 || idx >= s.n {
		r.bad.Add(1)
		return
	}
	if !s.recvAt[idx].CompareAndSwap(0, now) {
		s.dups.Add(1)
		return
	}
	if meta, err := m.Metadata(); err == nil {
		s.ackAt[idx].Store(meta.Timestamp.UnixNano())
	}
	s.received.Add(1)
}

func (r *receiver) stop() { r.cc.Stop() }

// runSchedule offers single-row transactions at rate for dur from writers
// connections, open loop, and records what the receiver sees.
func (e *env) runSchedule(ctx context.Context, d *database, r *receiver, relay *relayProc, mode string, pct int, rate float64, dur time.Duration, writers int) (SteadyResult, error) {
	s := newSchedule(rate, dur)
	r.cur.Store(s)
	res := SteadyResult{Mode: mode, Percent: pct, TargetRate: rate, Seconds: dur.Seconds(), Scheduled: s.n}
	ps0, _ := readProcStats(relay.cmd.Process.Pid)
	cpu0 := sampleCPU()
	s.start = time.Now().Add(20 * time.Millisecond)
	end := s.start.Add(dur)
	// Writers stop a grace period after the schedule's end: what the
	// database could not commit by then is dropped (and counted), so that a
	// saturated database does not stretch the phase without bound.
	cutoff := end.Add(min(2*time.Second, dur/4))
	jobs := make(chan int, s.n)
	wait := e.startWriters(ctx, d, s, jobs, writers, cutoff)
	go s.dispatch(ctx, jobs)
	committedAtEnd := s.sampleLag(end, &res)
	res.ProducerBehind = s.sent.Load() - committedAtEnd
	res.AchievedRate = float64(committedAtEnd) / time.Since(s.start).Seconds()
	if err := wait(); err != nil {
		return res, err
	}
	schedEnd := time.Now()
	res.Dropped = s.drops.Load()
	res.Saturated = res.Dropped > 0 || res.AchievedRate < 0.95*rate
	if err := s.waitCaughtUp(r, relay, max(10*time.Second, dur)); err != nil {
		return res, err
	}
	s.receipts(schedEnd, &res)
	ps1, _ := readProcStats(relay.cmd.Process.Pid)
	res.RelayCPU = ps1.CPUSeconds - ps0.CPUSeconds
	res.CPU = cpuBetween(cpu0, sampleCPU(), res.RelayCPU)
	res.RelayRSSMB = float64(ps1.RSSBytes) / (1 << 20)
	res.Committed, res.Received, res.Duplicates = s.commits.Load(), s.received.Load(), s.dups.Load()
	s.latencies(cutoff, &res)
	res.LagMiddle, res.LagEnd, res.LagMax = lagStats(res.Samples, dur.Seconds())
	res.Bounded = res.LagEnd <= 1.5*res.LagMiddle+rate/4
	e.logSchedule(res, rate, dur, cutoff.Sub(end))
	if res.Received < res.Committed {
		return res, fmt.Errorf("%s: received %d of %d committed events %s after the schedule ended; relay log tail:\n%s",
			res.label(), res.Received, res.Committed, time.Since(schedEnd).Round(time.Second), tail(relay.logPath, 20))
	}
	return res, nil
}

// newSchedule returns the schedule of rate events per second for dur.
func newSchedule(rate float64, dur time.Duration) *schedule {
	n := int(rate * dur.Seconds())
	return &schedule{tag: rand.Uint32() &^ 0xf0000000, n: n, period: 1e9 / rate,
		commitAt: make([]atomic.Int64, n), dropped: make([]atomic.Bool, n), ackAt: make([]atomic.Int64, n),
		recvAt: make([]atomic.Int64, n), readAt: make([]atomic.Int64, n)}
}

// startWriters starts writers goroutines committing the events of jobs into
// d; an event still queued after cutoff is dropped. The returned wait
// waits for them and returns the first writer's error.
func (e *env) startWriters(ctx context.Context, d *database, s *schedule, jobs <-chan int, writers int, cutoff time.Time) (wait func() error) {
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(s.tag)))
			for i := range jobs {
				if time.Now().After(cutoff) {
					s.dropped[i].Store(true)
					s.drops.Add(1)
					continue
				}
				if err := insertEvent(ctx, d, rng, s.tag, i, e.opts.Aggregates, e.opts.Payload); err != nil {
					errs <- err
					return
				}
				s.commitAt[i].Store(time.Now().UnixNano())
				s.commits.Add(1)
			}
		})
	}
	return func() error {
		wg.Wait()
		select {
		case err := <-errs:
			return err
		default:
			return nil
		}
	}
}

// dispatch hands every event that is due to jobs and closes it at the end;
// the writers' queueing shows up in the latencies because they are measured
// from the due time.
func (s *schedule) dispatch(ctx context.Context, jobs chan<- int) {
	defer close(jobs)
	for i := 0; i < s.n; {
		now := time.Now()
		for ; i < s.n && !s.due(i).After(now); i++ {
			jobs <- i
			s.sent.Add(1)
		}
		if i < s.n {
			wait := time.Until(s.due(i))
			if ctx.Err() != nil {
				return
			}
			time.Sleep(max(wait, 0))
		}
	}
}

// sampleLag records a lag sample in res every 100 ms until end and returns
// the events committed by then.
func (s *schedule) sampleLag(end time.Time, res *SteadyResult) int64 {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for now := range tick.C {
		res.Samples = append(res.Samples, lagSample{Seconds: now.Sub(s.start).Seconds(),
			Scheduled: s.sent.Load(), Committed: s.commits.Load(), Received: s.received.Load()})
		if now.After(end) {
			break
		}
	}
	return s.commits.Load()
}

// waitCaughtUp waits up to limit for the relay (and the pgoutput reader,
// when there is one) to receive what was committed; it fails when either
// failed.
func (s *schedule) waitCaughtUp(r *receiver, relay *relayProc, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for (s.received.Load() < s.commits.Load() || r.reader != nil && s.reads.Load() < s.commits.Load()) && time.Now().Before(deadline) {
		if err := relay.exited(); err != nil {
			return err
		}
		if r.reader != nil {
			if err := r.reader.failed(); err != nil {
				return err
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// receipts records in res the first receipt and how long after schedEnd the
// last one came (the last receipt, not the moment the wait noticed it).
func (s *schedule) receipts(schedEnd time.Time, res *SteadyResult) {
	var last int64
	for i := range s.n {
		v := s.recvAt[i].Load()
		last = max(last, v)
		if v > 0 && (res.firstReceipt == 0 || v < res.firstReceipt) {
			res.firstReceipt = v
		}
	}
	if last > 0 {
		res.CatchUpSecs = max(0, time.Unix(0, last).Sub(schedEnd).Seconds())
	}
	res.start = s.start
}

// latencies records in res the percentiles from the send time and from the
// commit to the broker's ack and to receipt. An event dropped at cutoff
// counts at its wait until then, which keeps the percentiles honest lower
// bounds instead of hiding the slowest events.
func (s *schedule) latencies(cutoff time.Time, res *SteadyResult) {
	var sendAck, sendRecv, commitAck, commitRecv, sendCommit histogram
	for i := range s.n {
		due := s.due(i).UnixNano()
		c, a, rv := s.commitAt[i].Load(), s.ackAt[i].Load(), s.recvAt[i].Load()
		if s.dropped[i].Load() {
			wait := time.Duration(cutoff.UnixNano() - due)
			sendCommit.record(wait)
			sendAck.record(wait)
			sendRecv.record(wait)
			continue
		}
		if c > 0 {
			sendCommit.record(time.Duration(c - due))
		}
		if a > 0 {
			sendAck.record(time.Duration(a - due))
			if c > 0 {
				commitAck.record(time.Duration(a - c))
			}
		}
		if rv > 0 {
			sendRecv.record(time.Duration(rv - due))
			if c > 0 {
				commitRecv.record(time.Duration(rv - c))
			}
		}
	}
	res.SendToAck, res.SendToReceipt = sendAck.summary(), sendRecv.summary()
	res.CommitToAck, res.CommitToRecv, res.SendToCommit = commitAck.summary(), commitRecv.summary(), sendCommit.summary()
	res.Decoder = decoderLatency(s)
}

// logSchedule logs one rate's figures, and its drops when the writers gave
// up grace after the schedule's end.
func (e *env) logSchedule(res SteadyResult, rate float64, dur, grace time.Duration) {
	o := e.opts
	o.logf("%s (%.0f/s for %s): committed %d (%.0f/s), received %d, p50/p99/max send→ack %.1f/%.1f/%.1f ms, commit→receipt p50/p99 %.1f/%.1f ms (pgoutput reader %.1f/%.1f ms), lag middle %.0f end %.0f, caught up %.2fs after",
		res.label(), rate, dur, res.Committed, res.AchievedRate, res.Received, res.SendToAck.P50, res.SendToAck.P99, res.SendToAck.Max,
		res.CommitToRecv.P50, res.CommitToRecv.P99, res.Decoder.P50, res.Decoder.P99, res.LagMiddle, res.LagEnd, res.CatchUpSecs)
	if res.Dropped > 0 {
		o.logf("%s: the database committed %.0f of %.0f offered events/s; %d events not committed %s after the schedule ended were dropped (counted in the latencies at their wait so far)",
			res.label(), res.AchievedRate, rate, res.Dropped, grace)
	}
}

// lagStats returns the mean lag over 40–60 % and 90–100 % of a run of secs
// seconds, and its maximum.
func lagStats(samples []lagSample, secs float64) (mid, end float64, mx int64) {
	var ms, es, mn, en float64
	for _, s := range samples {
		lag := s.Committed - s.Received
		mx = max(mx, lag)
		switch f := s.Seconds / secs; {
		case f >= 0.4 && f <= 0.6:
			ms += float64(lag)
			mn++
		case f >= 0.9 && f <= 1.0:
			es += float64(lag)
			en++
		}
	}
	if mn > 0 {
		mid = ms / mn
	}
	if en > 0 {
		end = es / en
	}
	return mid, end, mx
}

// steadyPercents are the offered loads, in percent of the commit rate.
var steadyPercents = []int{25, 50, 100}

// measureSteady runs the open-loop rates against a running relay in d.
func (e *env) measureSteady(ctx context.Context, d *database, commitRate float64, writers int) ([]SteadyResult, error) {
	o := e.opts
	if err := resetOutbox(ctx, d); err != nil {
		return nil, err
	}
	if err := d.exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		return nil, err
	}
	e.deleteStream(ctx)
	start := relayStarter(e.startRelay)
	if o.ProfileDir != "" {
		var err error
		if start, err = e.selfRelay(filepath.Join(o.ProfileDir, "steady-"+d.mode)); err != nil {
			return nil, err
		}
	}
	relay, err := start(d, "steady-"+d.mode)
	if err != nil {
		return nil, err
	}
	defer relay.stop()
	if err := relay.waitReady(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	ready := time.Now()
	r, err := e.startReceiver(ctx)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	if r.reader, err = startDecodeReader(ctx, d, &r.cur); err != nil {
		return nil, err
	}
	defer r.reader.close()
	// Warm up at 10 % of the commit rate, unrecorded: connections, caches
	// and the relay's start (wal mode streams a moment after /readyz).
	warm := min(2*time.Second, o.Steady/2)
	w, err := e.runSchedule(ctx, d, r, relay, d.mode, 10, commitRate/10, warm, writers)
	if err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	firstRecv := time.Duration(0)
	if w.firstReceipt > 0 {
		firstRecv = time.Unix(0, w.firstReceipt).Sub(relay.started)
		o.logf("%s: first event received %.2fs after the relay process started (%.2fs after it was ready; the first was sent %.2fs after ready)",
			d.mode, firstRecv.Seconds(), time.Unix(0, w.firstReceipt).Sub(ready).Seconds(), w.start.Sub(ready).Seconds())
	}
	var out []SteadyResult
	for _, ld := range steadyLoads(commitRate) {
		res, err := e.runSchedule(ctx, d, r, relay, d.mode, ld.percent, ld.rate, o.Steady, writers)
		res.RelayStartToFirstReceipt = firstRecv.Seconds()
		res.ReadyToFirstReceipt = time.Unix(0, w.firstReceipt).Sub(ready).Seconds()
		out = append(out, res)
		if err != nil {
			return out, err
		}
	}
	return out, relay.stop()
}

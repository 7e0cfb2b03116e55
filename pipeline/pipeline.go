// Package pipeline moves captured events to a sink: it keeps events of one
// aggregate in source order, publishes events of different aggregates
// concurrently and in batches, retries failures with backoff, dead-letters
// events that keep failing, and hands each settled batch back to its source
// to be archived.
package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/wait"
	"github.com/outboxrelay/relay/sink"
)

// Options configures a Pipeline. Zero values take the defaults given on each
// field.
type Options struct {
	// Logger receives the pipeline's logs. Default slog.Default().
	Logger *slog.Logger
	// Retry is the backoff for failed publishes.
	Retry Retry
	// MaxInFlight is the most events held between capture and settlement;
	// the source is not read while it is reached. Default 10000.
	MaxInFlight int
	// MaxInFlightBytes is the most bytes (event.Event.Size: payload,
	// headers and a per-event overhead) held between capture and
	// settlement; the source is not read while it is reached, so memory
	// stays bounded with large payloads (the window may be exceeded by
	// one batch). Default 16 MiB.
	MaxInFlightBytes int
	// BatchSize is the most events in one Publish call. Default 500.
	BatchSize int
	// MaxBatchBytes is the most bytes (event.Event.Size) in one Publish
	// call; an event larger than it is published alone. Default 8 MiB.
	MaxBatchBytes int
	// Concurrency is the most Publish calls in flight at once. Default 8.
	Concurrency int
	// ParkAggregate holds an aggregate's later events in the outbox once one
	// of its events was dead-lettered (see park.go). The source must stop
	// capturing aggregates that have a dead letter, capture each batch
	// within the Next call that returns it, and capture the events a
	// completed batch left (neither published nor dead) again, from the
	// oldest. Default false: the aggregate continues with its next event.
	ParkAggregate bool
	// Holder, when set, is the source (which may be wrapped) as a
	// capture.Holder: a broken destination's events are then left in the
	// outbox rather than held in memory (see held.go). Default: the source
	// when it implements capture.Holder itself, else none.
	Holder capture.Holder
	// Health, when set, is the source (which may be wrapped) as a
	// capture.Health: Stats.Capturing then asks it, so readiness follows
	// the source's connections while Next waits for rows. Default: the
	// source when it implements capture.Health itself, else none.
	Health capture.Health
	// Metrics records histograms and labelled counters; nil records none.
	Metrics *Metrics
	// HeldMaxAge is how long a destination may stay broken before its held
	// events, and those routed to it while it stays broken, are
	// dead-lettered with the reason (sink.held_max_age). Default 0: they
	// are held as long as it lasts.
	HeldMaxAge time.Duration
	// ProbeInterval is how often destinations without events are checked
	// with the sink's Probe, when the sink implements sink.Destinations;
	// it also bounds one probe. Default 5s.
	ProbeInterval time.Duration
	// ShutdownTimeout bounds the drain after the Run context is cancelled:
	// in-flight events keep being published and archived until it expires,
	// then what is left is abandoned to be captured again. Default 15s.
	ShutdownTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Retry.setDefaults()
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 10000
	}
	if o.MaxInFlightBytes <= 0 {
		o.MaxInFlightBytes = 16 << 20
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 500
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 8 << 20
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = 5 * time.Second
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 15 * time.Second
	}
}

// Stats are counters of a running pipeline, safe to read concurrently.
type Stats struct {
	Captured     atomic.Int64 // events received from the source
	Published    atomic.Int64 // events acknowledged by the sink
	DeadLettered atomic.Int64 // events given up on
	Retries      atomic.Int64 // failed publish attempts that will be retried
	Archived     atomic.Int64 // events whose batch was archived
	InFlight     atomic.Int64 // events captured and not yet settled
	Ready        atomic.Bool  // false while the broker, a fixed destination or every row-chosen one in use is broken (see sink.RowRouted)
	Broken       atomic.Int64 // destinations whose breaker is open
	// HeldAggregates counts the aggregates whose events are left in the
	// outbox while their destination is broken (see held.go).
	HeldAggregates atomic.Int64
	publishing     publishing     // Publish calls in flight, for SinkReady
	health         capture.Health // Options.Health
	failing        atomic.Bool    // the last Next failed, for a source without health
}

// Capturing reports whether capture works. With Options.Health it is the
// source's answer, which follows its connections to Postgres whether or not
// rows arrive (see capture.Health); without, it is false from a failed Next
// until a later one returns a batch.
func (s *Stats) Capturing() bool {
	if s.health != nil {
		return s.health.Capturing()
	}
	return !s.failing.Load()
}

// Pipeline connects one source to one sink. Run it once.
type Pipeline struct {
	src   capture.Source
	snk   sink.Sink
	opts  Options
	log   *slog.Logger
	stats Stats
	// broken lists the broken destinations; the engine replaces it.
	broken atomic.Pointer[[]DestinationStatus]
	// completed counts the batches whose Complete returned; each
	// completion takes the next number (see park.go).
	completed atomic.Uint64
	// captureFails reports the source's failing Next calls.
	captureFails *outage.Log
}

// captured is a batch with when its capture began.
type captured struct {
	batch capture.Batch
	at    captureMark
}

// captureMark is when a batch's capture began: gen is how many batches had
// been completed before the reader called the source's Next, and epoch is
// the batch's capture.EpochOf (see park.go).
type captureMark struct {
	gen, epoch uint64
}

// New returns a pipeline from src to snk.
func New(src capture.Source, snk sink.Sink, opts Options) *Pipeline {
	opts.setDefaults()
	if h, ok := src.(capture.Health); ok && opts.Health == nil {
		opts.Health = h
	}
	p := &Pipeline{src: src, snk: snk, opts: opts, log: opts.Logger,
		captureFails: outage.New(opts.Logger, "capture failed, retrying", "capture works again")}
	p.stats.Ready.Store(true)
	p.stats.health = opts.Health
	return p
}

// Stats returns the pipeline's live counters.
func (p *Pipeline) Stats() *Stats { return &p.stats }

// Destinations returns the destinations whose breaker is open, longest
// broken first, at most MaxLabelValues of them. Safe for concurrent use.
func (p *Pipeline) Destinations() []DestinationStatus {
	if l := p.broken.Load(); l != nil {
		return *l
	}
	return nil
}

// Run captures, publishes and archives until ctx is cancelled, then drains
// in-flight events for at most Options.ShutdownTimeout and returns nil. It
// returns an error when the source fails for good.
func (p *Pipeline) Run(ctx context.Context) error {
	hardCtx, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopTimer := context.AfterFunc(ctx, func() {
		time.AfterFunc(p.opts.ShutdownTimeout, cancelHard)
	})
	defer stopTimer()

	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	batches := make(chan captured)
	var readErr error
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		readErr = p.read(readCtx, batches)
	}()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		p.watchCapture(readCtx)
	}()

	e := newEngine(p, hardCtx)
	err := e.loop(ctx, batches, readDone, func() error { return readErr })
	if err != nil {
		cancelHard() // the relay stops: do not wait for publishes to time out
	}
	stopReading()
	<-readDone
	<-watchDone
	e.wait()
	return err
}

// read feeds batches from the source until ctx ends or the source fails for
// good. Failures that may pass are retried with backoff, and logged as a
// run (see outage.Log) that a batch, or the source's health, ends.
func (p *Pipeline) read(ctx context.Context, out chan<- captured) error {
	for {
		gen := p.completed.Load()
		b, err := p.src.Next(ctx)
		if ctx.Err() != nil {
			if b != nil {
				b.Abandon(context.WithoutCancel(ctx))
			}
			return ctx.Err()
		}
		if err != nil {
			if fault.ClassOf(err) == fault.Permanent {
				return fmt.Errorf("capture: %w", err)
			}
			p.stats.failing.Store(true)
			delay := p.opts.Retry.unavailableDelay(p.captureFails.Fail(err))
			if wait.Sleep(ctx, delay) != nil {
				return ctx.Err()
			}
			continue
		}
		p.stats.failing.Store(false)
		p.captureFails.OK()
		select {
		case out <- captured{batch: b, at: captureMark{gen: gen, epoch: capture.EpochOf(b)}}:
		case <-ctx.Done():
			b.Abandon(context.WithoutCancel(ctx))
			return ctx.Err()
		}
	}
}

// healthInterval is how often watchCapture asks the source's health.
const healthInterval = time.Second

// watchCapture ends a run of capture failures once the source's health
// (Options.Health) says it captures again, until ctx ends: an idle source's
// Next returns no batch to end it after it reconnects.
func (p *Pipeline) watchCapture(ctx context.Context) {
	if p.opts.Health == nil {
		return
	}
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.captureFails.Failing() && p.opts.Health.Capturing() {
			p.captureFails.OK()
		}
	}
}

// completer runs batch completions in their own goroutines and waits for
// them on shutdown.
type completer struct {
	wg  sync.WaitGroup
	ctx context.Context
	st  *Stats
	gen *atomic.Uint64 // Pipeline.completed
	// fails reports the failed archives as runs.
	fails *outage.Log
}

func (c *completer) complete(bs *batchState) {
	c.wg.Go(func() {
		defer func() { bs.archive.gen.Store(c.gen.Add(1)) }()
		if err := bs.batch.Complete(c.ctx, bs.outcome); err != nil {
			c.fails.Fail(err, "events", len(bs.batch.Events()))
			return
		}
		c.fails.OK()
		c.st.Archived.Add(int64(len(bs.outcome.Published)))
	})
}

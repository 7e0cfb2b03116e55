package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
)

// Relay is a configured, connected relay ready to Run.
type Relay struct {
	cfg        *config.Config
	log        *slog.Logger
	pipeline   *pipeline.Pipeline
	pool       *pgxpool.Pool
	reg        *prometheus.Registry
	dbFailures *dbFailures
	source     any // the capture source, for its leader and partition state
	backlog    *sampled
	dlq        *sampled     // rows in the dead-letter table
	ln         net.Listener // http.listen, served by Run; nil with front or without http.listen
	front      *front       // relay run's handler, serving from before Open; nil: Open listens itself
	addr       string       // the HTTP address it advertises (see advertised); "" without http.listen
	peers      peers        // the relays on the outbox, for GET /status
	closers    []func()
}

// pipelineWindow is the most events held between capture and archive.
const pipelineWindow = 10000

// backlogInterval is how often the age of the oldest outbox row and the
// rows of the dead-letter table are sampled.
const backlogInterval = 5 * time.Second

// Open connects to Postgres and the sink, creates the dead-letter table and
// what the sink needs (NATS stream, a fixed Kafka topic) when missing, and returns a relay ready to run. A missing
// outbox table is an error naming it.
func Open(ctx context.Context, cfg *config.Config, log *slog.Logger) (*Relay, error) {
	r := &Relay{cfg: cfg, log: log}
	if err := r.open(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Relay) open(ctx context.Context) error {
	cfg, log := r.cfg, r.log
	if r.front == nil {
		if err := r.listen(); err != nil {
			return err
		}
	}
	tracer, err := r.startTracing(ctx)
	if err != nil {
		return err
	}
	batch := cfg.Capture.Poll.BatchSize
	conns, err := budget(cfg)
	if err != nil {
		return err
	}
	r.addr = advertised(ctx, cfg, r.bound())
	pool, err := connectAs(ctx, cfg.Postgres, int32(conns.pooled), relayName(r.addr))
	if err != nil {
		return err
	}
	r.closers = append(r.closers, pool.Close)
	r.pool = pool
	if err := checkSession(ctx, cfg.Postgres, pool.Config()); err != nil {
		return err
	}
	if err := checkGrants(ctx, pool, cfg); err != nil {
		return err
	}

	snk, err := openSink(ctx, cfg, log, pipelineWindow)
	if err != nil {
		return err
	}
	r.closers = append(r.closers, func() { snk.Close() })
	if _, err := snk.prepare(ctx); err != nil {
		return err
	}

	src, err := openSource(ctx, cfg, pool, log)
	if err != nil {
		return err
	}
	r.closers = append(r.closers, func() { src.Close() })
	if !cfg.Capture.WAL.Messages() {
		logOutboxWarnings(ctx, pool, cfg, log)
	}

	r.reg = newRegistry()
	batch, window := limitRate(snk, cfg.Sink.RateLimit, r.reg, log, batch)
	var info schema.Info // the table-free outbox has none: no backlog sample runs
	if !cfg.Capture.WAL.Messages() {
		if info, err = schema.InspectFor(ctx, pool, layoutOf(cfg), cfg.Capture.Mode == "wal"); err != nil {
			return err
		}
	}
	r.backlog = newBacklogAge(layoutOf(cfg), cfg.Archive.Mode, info)
	r.dlq = newDeadLetterCount(layoutOf(cfg))
	r.dbFailures = &dbFailures{Source: tracedSource(tracer, recorded(src, snk, cfg, pool), cfg), log: log, layout: layoutOf(cfg), cfg: cfg,
		role: pool.Config().ConnConfig.User, initial: cfg.Retry.Initial.D(), max: cfg.Retry.Max.D(),
		fatalAfter: cfg.Postgres.FatalAfter.D()}
	r.pipeline = pipeline.New(r.dbFailures, tracedSink(tracer, snk, cfg.Sink), pipeline.Options{
		Logger:  log,
		Metrics: pipeline.NewMetrics(r.reg, cfg.Sink.Type),
		Retry: pipeline.Retry{Initial: cfg.Retry.Initial.D(), Max: cfg.Retry.Max.D(),
			MaxAttempts: cfg.Retry.MaxAttempts},
		ParkAggregate:    cfg.DeadLetter.ParkAggregate,
		Holder:           holderOf(src, cfg),
		Health:           healthOf(src),
		HeldMaxAge:       cfg.Sink.HeldMaxAge.D(),
		MaxInFlight:      window,
		MaxInFlightBytes: 2 * cfg.Capture.MaxBatchBytes,
		BatchSize:        batch,
		MaxBatchBytes:    cfg.Capture.MaxBatchBytes,
		ShutdownTimeout:  cfg.ShutdownTimeout.D(),
	})
	r.source = src
	registerStats(r.reg, r.pipeline.Stats(), src, r.backlog, r.capturing, cfg.Sink.HeldMaxAge.D())
	registerTables(r.reg, cfg.Capture.Mode, r.dlq)
	if cfg.Archive.Mode == schema.ArchivePartition {
		registerTruncations(r.reg, src)
	}
	r.reg.MustRegister(newDestinationCollector(r.pipeline.Destinations))
	registerHeaderDrops(r.reg, snk.drops, cfg.Sink.Type)
	registerRunBreaks(r.reg, snk.runBreaks)
	return nil
}

// capturing reports whether capture works: the source reaches Postgres
// (pipeline.Stats.Capturing) and no lasting database failure (a missing
// grant or table) persists.
func (r *Relay) capturing() bool {
	return r.pipeline.Stats().Capturing() && r.dbFailures.failing() == nil
}

// Stats returns the pipeline's live counters.
func (r *Relay) Stats() *pipeline.Stats { return r.pipeline.Stats() }

// Run relays until ctx is cancelled, then drains in-flight work and returns
// nil. It serves the HTTP endpoints when http.listen is set.
func (r *Relay) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.pipeline.Run(ctx) })
	if !r.cfg.Capture.WAL.Messages() && r.cfg.Archive.Mode != schema.ArchivePartition { // no outbox table, or one that keeps published rows: the backlog is the slot's lag
		g.Go(func() error { return r.backlog.watch(gctx, r.pool, backlogInterval) })
	}
	g.Go(func() error { return r.dlq.watch(gctx, r.pool, backlogInterval) })
	if r.addr != "" { // only GET /status serves the peers
		g.Go(func() error { return r.peers.watch(gctx, r.pool, layoutOf(r.cfg)) })
	}
	if r.cfg.Archive.Retention > 0 && !r.cfg.Capture.WAL.Messages() {
		g.Go(func() error { return r.prune(gctx) })
	}
	if r.ln != nil {
		g.Go(func() error { return r.serveHTTP(gctx) })
	}
	return g.Wait()
}

// Close releases the sink, the source and the database pool.
func (r *Relay) Close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// holderOf returns src as a capture.Holder (both sources are), or nil: nil
// for the table-free outbox (capture.wal.source messages), which has no
// table to leave a broken destination's events in, so the pipeline holds
// them in memory, and the slot with them.
func holderOf(src capture.Source, cfg *config.Config) capture.Holder {
	if cfg.Capture.WAL.Messages() {
		return nil
	}
	if o, ok := src.(interface{ HoldsInOutbox() bool }); ok && !o.HoldsInOutbox() {
		return nil
	}
	h, _ := src.(capture.Holder)
	return h
}

// healthOf returns src as a capture.Health (both sources are), or nil.
func healthOf(src capture.Source) capture.Health {
	h, _ := src.(capture.Health)
	return h
}

// recorded wraps src in a recordedSource when the sink records what it
// published (sink.kafka.transactional).
func recorded(src capture.Source, snk *brokerSink, cfg *config.Config, pool *pgxpool.Pool) capture.Source {
	if r, ok := snk.routedSink.(sink.Recorder); ok && transactional(cfg) {
		return &recordedSource{Source: src, rec: r, unarchived: unarchivedIn(pool, layoutOf(cfg), cfg.Archive.Mode)}
	}
	return src
}

// transactional reports whether the relay publishes in Kafka transactions
// (sink.kafka.transactional): its transactional id admits one producer, so
// in poll mode one relay at a time captures (poll.Options.Exclusive); in
// wal mode one does anyway.
func transactional(cfg *config.Config) bool {
	return cfg.Sink.Type == "kafka" && cfg.Sink.Kafka.Transactional
}

// messagePrefix returns capture.wal.message_prefix with the table-free
// outbox (capture.wal.source messages), else "".
func messagePrefix(cfg *config.Config) string {
	if cfg.Capture.WAL.Messages() {
		return cfg.Capture.WAL.MessagePrefix
	}
	return ""
}

// openSource builds the capture source capture.mode selects.
func openSource(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, log *slog.Logger) (capture.Source, error) {
	l := layoutOf(cfg)
	if cfg.Capture.Mode == "wal" {
		return wal.New(ctx, wal.Options{Pool: pool, Layout: table.Layout(l),
			Slot: cfg.Capture.WAL.Slot, Publication: cfg.Capture.WAL.Publication,
			ArchiveMode: cfg.Archive.Mode, Partitions: cfg.Archive.Partitions, PartitionRows: int64(cfg.Archive.PartitionRows),
			BatchSize: cfg.Capture.Poll.BatchSize, MaxBatchBytes: cfg.Capture.MaxBatchBytes,
			Failover: cfg.Capture.WAL.Failover, Linger: cfg.Capture.WAL.Linger.D(), MessagePrefix: messagePrefix(cfg), Logger: log})
	}
	return poll.New(ctx, poll.Options{
		Pool: pool, Layout: table.Layout(l), BatchSize: cfg.Capture.Poll.BatchSize, MaxBatchBytes: cfg.Capture.MaxBatchBytes,
		Interval: cfg.Capture.Poll.Interval.D(), Linger: cfg.Capture.Poll.Linger.D(), Partitions: cfg.Capture.Poll.Partitions,
		ParkAggregates: cfg.DeadLetter.ParkAggregate, ArchiveMode: cfg.Archive.Mode, Logger: log,
		Exclusive: transactional(cfg),
	})
}

// RunConfig opens a relay from cfg and runs it until ctx is cancelled. It
// serves http.listen from the start: while Postgres or the broker cannot be
// reached it waits, not ready, and tries again (see openWhenReachable).
func RunConfig(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	f := newFront()
	ln, err := listen(cfg)
	if err != nil {
		return err
	}
	if ln != nil {
		f.bound = ln.Addr()
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- serve(sctx, ln, f) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				log.Error("http server", "err", err)
			}
		}()
	}
	r, err := openWhenReachable(ctx, cfg, log, f)
	if r == nil {
		return err
	}
	defer r.Close()
	f.set(r.handler())
	log.Info("relay running", "capture", cfg.Capture.Mode, "sink", cfg.Sink.Type,
		"table", cfg.Outbox.Table, "postgres", describeDB(cfg.Postgres))
	if err := r.Run(ctx); err != nil {
		return err
	}
	log.Info("relay stopped", "published", r.Stats().Published.Load())
	return nil
}

// pruneInterval is how often archived rows past archive.retention are
// deleted.
const pruneInterval = time.Minute

// pruneBatch is the most archived rows one prune statement deletes.
const pruneBatch = 5000

// prune deletes archived rows older than archive.retention every
// pruneInterval until ctx ends, in statements of at most pruneBatch rows.
// Failures are retried and logged as a run (see outage.Log).
func (r *Relay) prune(ctx context.Context) error {
	stmt := layoutOf(r.cfg).PruneArchive(r.cfg.Archive.Mode)
	if stmt == "" {
		return nil
	}
	fails := outage.New(r.log, "prune archive failed", "pruning the archive works again")
	t := time.NewTicker(pruneInterval)
	defer t.Stop()
	for {
		n, err := r.pruneOnce(ctx, stmt)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			fails.Fail(err)
		default:
			fails.OK()
			if n > 0 {
				r.log.Info("pruned archived rows", "rows", n, "retention", r.cfg.Archive.Retention.D())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pruneOnce runs stmt until it deletes fewer than pruneBatch rows and
// returns how many it deleted.
func (r *Relay) pruneOnce(ctx context.Context, stmt string) (int64, error) {
	var total int64
	for {
		tag, err := r.pool.Exec(ctx, stmt, r.cfg.Archive.Retention.D(), pruneBatch)
		total += tag.RowsAffected()
		if err != nil || tag.RowsAffected() < pruneBatch {
			return total, err
		}
	}
}

// bound returns the address the HTTP server listens on, nil without one.
func (r *Relay) bound() net.Addr {
	switch {
	case r.ln != nil:
		return r.ln.Addr()
	case r.front != nil:
		return r.front.bound
	}
	return nil
}

// listen opens http.listen, so a taken address fails before the relay runs.
func (r *Relay) listen() error {
	ln, err := listen(r.cfg)
	if ln != nil {
		r.ln = ln
		r.closers = append(r.closers, func() { ln.Close() })
	}
	return err
}

// listen opens cfg's http.listen; it returns nil without one.
func listen(cfg *config.Config) (net.Listener, error) {
	if cfg.HTTP.Listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return nil, fmt.Errorf("http.listen %s: %w", cfg.HTTP.Listen, err)
	}
	return ln, nil
}

// The HTTP listener's timeouts. A client has httpReadHeaderTimeout to send
// a request's headers and httpReadTimeout for the whole request; a response
// must be written within httpWriteTimeout, which leaves room for pprof's
// default 30-second CPU profile; a keep-alive connection idle for
// httpIdleTimeout is closed.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = time.Minute
	httpIdleTimeout       = 30 * time.Second
)

// serveHTTP serves /healthz, /readyz and /metrics until ctx is cancelled.
func (r *Relay) serveHTTP(ctx context.Context) error {
	return serve(ctx, r.ln, r.handler())
}

// serve serves h on ln until ctx is cancelled, then shuts down within 2s;
// it closes ln.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	}
}

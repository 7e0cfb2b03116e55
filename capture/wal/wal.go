// Package wal captures outbox rows by logical replication: it streams the
// outbox table's inserts from a pgoutput replication slot, in commit order,
// and archives them after the pipeline settled them.
//
// One relay per outbox table streams; others on the same table stand by and
// take over when its session ends. The slot is confirmed only past archived
// events. Rows older than the slot (first run, a dropped or lost slot,
// failover) are published from the table first, in seq order. Memory is
// bounded whatever the size of a transaction. After a broken connection
// Next returns a retryable error and the next call resumes from the slot's
// confirmed position, so events may be delivered again with the same ids.
// With Options.MessagePrefix it captures the table-free outbox instead:
// logical decoding messages, with no table (see message.go). An outbox
// table without seq, headers or created_at (one made for Debezium) is
// captured too, with the differences scan.go and replay.go describe.
// docs/design.md describes how.
package wal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/schema"
)

// Options configures a Source. Zero values take the defaults given.
type Options struct {
	// Pool serves archiving, slot management, health checks and the drain,
	// each holding a connection for a few round trips only. The
	// replication and lock connections are opened separately with the
	// pool's config: see DedicatedConns.
	Pool *pgxpool.Pool
	// ReplConfig configures the replication connection. Default: the
	// pool's connection config. A copy is used, with replication=database,
	// DateStyle ISO, TimeZone UTC and bytea_output hex set.
	ReplConfig *pgconn.Config
	// Layout names the outbox and dead-letter tables (and the archive
	// table of archive mode move); the drain table is named after the
	// outbox.
	Layout table.Layout
	// Slot is the logical replication slot (pgoutput), created when
	// missing. Required; lowercase letters, digits and _, at most 63.
	Slot string
	// Publication is the publication of the outbox's inserts, created when
	// missing. Required.
	Publication string
	// ArchiveMode is what happens to published rows: schema.ArchiveDelete,
	// ArchiveMark, ArchiveMove or ArchivePartition. Default delete. With
	// ArchivePartition published rows stay in the outbox, a ring of
	// Partitions list partitions of PartitionRows seqs each (see
	// schema.Ring), and the leader truncates a partition once every row in
	// it was published or dead-lettered (see truncate.go); the source is
	// then no capture.Holder (see HoldsInOutbox).
	ArchiveMode string
	// Partitions and PartitionRows are the ring of ArchivePartition, which
	// the outbox must be; unused with the other modes.
	Partitions    int
	PartitionRows int64
	// BatchSize is the most rows in one batch. Default 500.
	BatchSize int
	// MaxBatchBytes ends a batch once its events hold this many bytes
	// (event.Event.Size); a row larger than it is a batch of its own, so a
	// transaction of any size streams through in batches of about this
	// size. Rows handed out and not archived yet hold at most three times
	// as much: the stream is not read meanwhile. Default 8 MiB.
	MaxBatchBytes int
	// Linger is how long a busy stream of small transactions gathers into
	// one batch: while reads from the replication socket bring less than
	// 8 KiB each and come within twice Linger of each other, the next read
	// waits until Linger after the last one, which then takes every
	// transaction committed meanwhile, and they travel as one batch, so the
	// relay wakes up, publishes and archives once per Linger instead of
	// once per transaction; each waits at most Linger for it. A larger read
	// is followed at once, so a backlog streams at full speed, and a light
	// stream is read as it arrives. Default DefaultLinger; negative: no
	// wait.
	Linger time.Duration
	// StatusInterval is the longest time between standby status updates.
	// It is lowered to a third of the connection's wal_sender_timeout.
	// Default 1s, so that a crash replays little more than a second of
	// already archived events.
	StatusInterval time.Duration
	// GuardInterval is the time between observations of the slot (one
	// short query on the pool; see Slot). Default 10s.
	GuardInterval time.Duration
	// StallAfter is how long the slot's confirmed position may stay put
	// while the outbox holds rows this relay does not hold before the
	// leader reconnects its stream, and then publishes the outbox from the
	// table (see Slot). Default 1m.
	StallAfter time.Duration
	// Failover creates the slot with failover enabled, so that standbys
	// with sync_replication_slots keep it (PostgreSQL 17 and later; older
	// servers are a permanent error), and enables it on an existing slot.
	// Default false.
	Failover bool
	// MessagePrefix, when set, makes the source capture the table-free
	// outbox: the transactional logical decoding messages with this prefix
	// (pg_logical_emit_message, PostgreSQL 14 and later; see message.go)
	// rather than the outbox table's inserts. There is then no outbox,
	// archive or drain table, the publication may cover no table, and the
	// source must not be used as a capture.Holder: a broken destination's
	// events are held in the pipeline's memory, and the slot with them.
	// Default "": the outbox table.
	MessagePrefix string
	// Logger receives the source's logs. Default slog.Default().
	Logger *slog.Logger
}

// DedicatedConns is how many connections a Source opens besides its pool:
// the replication connection, the leader lock's connection and, while rows
// older than the slot are drained, the table claim's lease connection.
const DedicatedConns = 2 + claim.DedicatedConns

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ring reports whether the outbox is archive mode partition's ring.
func (o *Options) ring() bool { return o.ArchiveMode == schema.ArchivePartition }

func (o *Options) setDefaults() error {
	if !slotName.MatchString(o.Slot) {
		return fmt.Errorf("replication slot name %q must match %s", o.Slot, slotName)
	}
	if o.Publication == "" {
		return errors.New("publication name is empty")
	}
	if o.ArchiveMode == "" {
		o.ArchiveMode = schema.ArchiveDelete
	}
	if o.ring() && (o.MessagePrefix != "" || o.Partitions < 1 || o.PartitionRows < 1) {
		return errors.New("archive mode partition needs an outbox table and the ring's partitions and partition rows")
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 500
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 8 << 20
	}
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	if o.StatusInterval <= 0 {
		o.StatusInterval = time.Second
	}
	if o.GuardInterval <= 0 {
		o.GuardInterval = 10 * time.Second
	}
	if o.StallAfter <= 0 {
		o.StallAfter = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Source is a wal-mode capture.Source. Next must be called from one
// goroutine; batches may be completed from others; Slot is safe for
// concurrent use.
type Source struct {
	opts   Options
	layout schema.Layout // opts.Layout
	info   schema.Info   // what prepareSource learned of the outbox
	log    *slog.Logger
	sql    queries
	arch   *archiver
	repl   *pgconn.Config
	pace   *pacer // the paced reads' timer, of one stream at a time
	lead   *leadership
	guard  guard
	stop   context.CancelFunc
	wg     sync.WaitGroup

	// Shared between Next and the guard: the last stream opened, the
	// cancellation of a stream being opened, whether a drain runs, and a
	// drain the guard asks for.
	cur      atomic.Pointer[stream]
	opening  atomic.Pointer[context.CancelCauseFunc]
	draining atomic.Bool
	fallback atomic.Bool
	// failed is set when Next returns an error, until a stream or a drain
	// starts or a batch comes (see Capturing).
	failed atomic.Bool

	// Used by Next only: at most one of them is set.
	st    *stream
	drain *drain
	// drainedTo is the bound of this run's last drain that ended with
	// rows of held aggregates left; used by Next only. A pending drain up
	// to it runs again only after Release.
	drainedTo int64

	// held are the aggregates the pipeline holds in the outbox (see
	// Hold); redrain is set by Release until the next drain begins.
	held    capture.HeldKeys
	redrain atomic.Bool
	// drainClaims is the running drain's claim source, which Release
	// rewinds; nil while no drain runs.
	drainClaims atomic.Pointer[claim.Source]
	// ledger numbers the captures of Next by release epoch (see
	// capture.Holder), and released is the epoch of the last Release.
	ledger   capture.Ledger
	released atomic.Uint64
	// resumeAt is where the last stream's handed-out batches were archived
	// up to, on the slot and timeline of s.timeline; used by Next only: a
	// stream opened again after a drain starts there when the slot's
	// confirmed position is behind it, rather than streaming archived rows
	// again.
	resumeAt pglogrepl.LSN

	// Used by Next only: the WAL timeline the slot was last seen on, 0
	// before the slot was first seen.
	timeline int64
	// recreated counts slot recreations by reason; its counters are
	// atomic.
	recreated map[string]*atomic.Int64
	// skipped counts replayed events dropped, see Replayed.
	skipped atomic.Int64

	drainedMu sync.Mutex
	unsettled map[*drained]bool // drained batches not completed or abandoned

	// partitions are the ring outbox's partitions, quoted, in the order of
	// their values (ArchivePartition only); truncated counts their
	// truncations and lockWaits the truncations given up for a lock.
	partitions           []string
	truncated, lockWaits atomic.Int64
}

// New checks the database (wal_level, the replication privilege, the
// outbox table), creates the dead-letter and drain tables, the publication
// and the archive table of archive mode move when they are missing, and
// starts competing for leadership. Problems that retrying cannot fix, such
// as a missing outbox table or a publication that does not cover it, are
// permanent errors naming what is wrong. The slot is created by the leader,
// in Next. Call Close when done.
func New(ctx context.Context, opts Options) (*Source, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fault.AsPermanent(err)
	}
	l := schema.Layout(opts.Layout)
	info, err := prepareSource(ctx, opts)
	if err != nil {
		return nil, err
	}
	var partitions []string
	if opts.ring() {
		if partitions, err = schema.InspectRing(ctx, opts.Pool, l, schema.Ring{Partitions: opts.Partitions, Rows: opts.PartitionRows}); err != nil {
			return nil, err
		}
	}
	bySeq, err := seqArchive(ctx, opts, l, info)
	if err != nil {
		return nil, err
	}
	s := &Source{partitions: partitions, opts: opts, log: opts.Logger, layout: l, info: info, sql: buildQueries(l, opts.ArchiveMode, info, opts.Slot), repl: replConfig(opts),
		pace: newPacer(), unsettled: map[*drained]bool{}, recreated: map[string]*atomic.Int64{},
		lead: newLeadership(opts.Pool.Config().ConnConfig.Copy(), l, opts.Logger)}
	s.guard = *newGuard(l, opts.ArchiveMode, opts.MessagePrefix != "", len(info.Missing) > 0)
	s.guard.fails = outage.New(opts.Logger, "replication slot observation failed; the slot metrics keep their last values until it works again",
		"replication slot observation works again")
	for _, r := range SlotRecreateReasons {
		s.recreated[r] = new(atomic.Int64)
	}
	bg, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.arch = newArchiver(bg, opts.Pool, s.sql.archive, bySeq, maxUnarchivedBatches*opts.BatchSize, opts.BatchSize)
	s.wg.Go(func() { s.lead.run(bg) })
	s.wg.Go(func() { s.watchSlot(bg) })
	return s, nil
}

// prepareSource checks the database and creates what the source needs
// (see New), returning what it learned of the outbox's columns: with
// Options.MessagePrefix the dead-letter table and the publication only
// (see prepareMessages).
func prepareSource(ctx context.Context, opts Options) (schema.Info, error) {
	l := schema.Layout(opts.Layout)
	if opts.MessagePrefix != "" {
		return l.MessageInfo(), prepareMessages(ctx, opts.Pool, l, opts.Publication, opts.Failover)
	}
	info, err := schema.InspectSource(ctx, opts.Pool, l, true)
	if err != nil {
		return info, err
	}
	if len(info.Missing) > 0 && opts.ArchiveMode != "" && opts.ArchiveMode != schema.ArchiveDelete {
		return info, fault.AsPermanent(fmt.Errorf("outbox table %s has no column %s: archive.mode %s needs it, use archive.mode delete or add it (see docs/migrating-from-debezium.md)",
			l.Outbox, strings.Join(info.Missing, ", "), opts.ArchiveMode))
	}
	if err := checkServer(ctx, opts.Pool); err != nil {
		return info, err
	}
	if err := checkFailover(ctx, opts.Pool, opts.Failover); err != nil {
		return info, err
	}
	if err := prepare(ctx, opts.Pool, l, info, opts.Publication); err != nil {
		return info, err
	}
	return info, schema.EnsureArchive(ctx, opts.Pool, l, opts.ArchiveMode, info)
}

// checkServer fails permanently when wal_level is not logical or the role
// may not replicate (schema.CanReplicate).
func checkServer(ctx context.Context, q schema.Querier) error {
	level, role, canReplicate, err := readServer(ctx, q)
	if err != nil {
		return fmt.Errorf("check wal_level: %w", err)
	}
	if err := checkWALLevel(level); err != nil {
		return fault.AsPermanent(err)
	}
	if err := checkReplication(role, canReplicate); err != nil {
		return fault.AsPermanent(err)
	}
	return nil
}

// readServer returns the server's wal_level, the current role and whether
// it may use replication (schema.CanReplicate).
func readServer(ctx context.Context, q schema.Querier) (level, role string, canReplicate bool, err error) {
	err = q.QueryRow(ctx, `SELECT current_setting('wal_level'), current_user, (`+schema.CanReplicate+`)`).Scan(&level, &role, &canReplicate)
	return level, role, canReplicate, err
}

// checkWALLevel fails, saying how to fix it, unless level is logical.
func checkWALLevel(level string) error {
	if level != "logical" {
		return fmt.Errorf("wal_level is %s; wal capture needs logical: ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL", level)
	}
	return nil
}

// checkReplication fails, saying how to fix it, unless role may replicate.
func checkReplication(role string, canReplicate bool) error {
	if !canReplicate {
		return fmt.Errorf("role %s may not use replication: %s", role, replicationFix(role))
	}
	return nil
}

// prepare creates the dead-letter and drain tables and the publication
// when they are missing.
func prepare(ctx context.Context, q schema.Querier, l schema.Layout, info schema.Info, pub string) error {
	if err := schema.EnsureDeadLetter(ctx, q, l, info); err != nil {
		return err
	}
	if err := schema.EnsureDrainTable(ctx, q, l); err != nil {
		return err
	}
	return ensurePublication(ctx, q, l, pub)
}

// replConfig returns the replication connection's config.
func replConfig(opts Options) *pgconn.Config {
	c := opts.ReplConfig
	if c == nil {
		c = &opts.Pool.Config().ConnConfig.Config
	}
	c = c.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.RuntimeParams["DateStyle"] = "ISO"
	c.RuntimeParams["TimeZone"] = "UTC"
	c.RuntimeParams["bytea_output"] = "hex"
	// A cancel request would end the replication: a context deadline only
	// interrupts the read.
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c
}

// pacedConfig returns a copy of the replication connection's config whose
// connection reads through a pacedReader with pace, sleeping on pc, on a
// markConn where there is one, and a function returning that reader once
// connected.
func pacedConfig(c *pgconn.Config, pace time.Duration, pc *pacer) (*pgconn.Config, func() *pacedReader) {
	c = c.Copy()
	if dial := c.DialFunc; dial != nil {
		c.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return withMark(conn), nil
		}
	}
	var last *pacedReader // of the last connection attempt, the one that succeeded
	c.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		last = &pacedReader{r: r, pace: pace, pacer: pc, raise: markRaiser(w)}
		return pgproto3.NewFrontend(bufio.NewReaderSize(last, replReadBuffer), w)
	}
	return c, func() *pacedReader { return last }
}

// replReadBuffer is how much of the replication stream one read from the
// socket takes at most. pgx reads 8 KiB at a time, a few dozen rows of a
// backlog; a larger buffer takes them in fewer system calls. The
// connection is never used directly (SyncConn, Hijack), which would miss
// what the buffer holds.
const replReadBuffer = 64 << 10

// DefaultLinger is Options.Linger's default.
const DefaultLinger = 2 * time.Millisecond

// replSmallRead is the size of a read under which the next one is paced.
const replSmallRead = replReadBuffer / 8

// pacedReader reads from r at most once per pace (Options.Linger) while
// the stream is busy: the last read was small (under replSmallRead bytes)
// and returned within twice the pace of the one before (a read that ended
// with an error and nothing read does not count). A light stream is
// read as data arrives, without a timer per read, and so is a backlog.
// It waits on pacer (nil: Go's timers). Before it waits for the pace it
// calls raise, when set (see markConn), so that the messages arriving
// meanwhile do not wake the process. Before
// each read it calls caughtUp, when set: the connection's reader asks for
// more bytes only once it has taken every complete message of the bytes
// read before. It is used by the connection's one reader.
type pacedReader struct {
	r        io.Reader
	pace     time.Duration
	last     time.Time // when the last read returned
	busy     bool
	pacer    *pacer
	raise    func()
	caughtUp func()
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if p.caughtUp != nil {
		p.caughtUp()
	}
	if d := time.Until(p.last.Add(p.pace)); p.busy && d > 0 {
		if p.raise != nil {
			p.raise()
		}
		p.pacer.sleep(d)
	}
	n, err := p.r.Read(b)
	if n == 0 && err != nil {
		return n, err // a deadline or a poke: nothing read, nothing to pace
	}
	now := time.Now()
	p.busy = n < replSmallRead && now.Sub(p.last) < 2*p.pace
	p.last = now
	return n, err
}

// Next returns the next batch: drained rows while a drain is pending, then
// the stream's. It waits while another relay leads. After the stream ended
// it returns a retryable error; the next call reconnects.
func (s *Source) Next(ctx context.Context) (capture.Batch, error) {
	b, err := s.next(ctx)
	switch {
	case err == nil:
		s.failed.Store(false)
	case ctx.Err() == nil:
		s.failed.Store(true)
	}
	return b, err
}

// Capturing reports whether the source can capture (capture.Health): the
// leader lock's connection is up and its last statement worked (it runs
// one every second, leading or standing by), and, while this relay leads,
// the stream or drain runs: no Next call failed since the last one started.
// A relay standing by is capturing while it reaches Postgres. It is safe
// for concurrent use.
func (s *Source) Capturing() bool {
	return s.lead.reachable() && (!s.lead.leading() || !s.failed.Load())
}

func (s *Source) next(ctx context.Context) (capture.Batch, error) {
	for {
		term, err := s.lead.wait(ctx)
		if err != nil {
			return nil, err
		}
		if s.st == nil && s.drain == nil {
			if err := s.awaitRelease(ctx); err != nil {
				return nil, err
			}
			s.failed.Store(false)
		}
		epoch := s.ledger.Begin()
		b, err, again := s.nextOnce(ctx, term)
		if b != nil {
			return s.ledger.Track(b, epoch), nil
		}
		s.ledger.End(epoch)
		if !again {
			return nil, err
		}
	}
}

// nextOnce is one attempt of Next: it returns a batch, or an error and
// again false, or again true when Next is to try again.
func (s *Source) nextOnce(ctx, term context.Context) (b capture.Batch, err error, again bool) {
	switch {
	case s.drain != nil:
		b, err := s.drainNext(ctx, term)
		return b, err, b == nil && err == nil
	case s.st != nil:
		b, err := s.st.next(ctx)
		if err != nil && ctx.Err() == nil {
			s.endStream()
			if errors.Is(err, errRedrain) {
				return nil, nil, true
			}
		}
		return b, err, false
	default:
		if err := s.start(ctx, term); err != nil {
			return nil, err, false
		}
		return nil, nil, true
	}
}

// endStream forgets the stream after it ended, keeping where its batches
// were archived up to (see resumeAt).
func (s *Source) endStream() {
	s.resumeAt = max(s.resumeAt, s.st.position())
	s.st = nil
}

// releaseWait bounds how long Next waits, after a Release, for the batches
// handed out before it to settle before the drain claims from the table:
// rows of batches still in flight then may be published twice.
const releaseWait = 10 * time.Second

// awaitRelease waits, after a Release, until the batches handed out before
// it have settled or releaseWait passed, so that the drain that follows
// claims no row they hold (it would be published twice) and the stream
// opened after it starts past the rows they archived.
func (s *Source) awaitRelease(ctx context.Context) error {
	epoch := s.released.Load()
	if epoch == 0 || s.ledger.SettledBefore(epoch) {
		return nil
	}
	timer := time.NewTimer(releaseWait)
	defer timer.Stop()
	for !s.ledger.SettledBefore(epoch) {
		select {
		case <-s.ledger.Changed():
		case <-timer.C:
			s.log.Info("draining the outbox while batches handed out before a release are still unsettled; their rows may be published twice",
				"waited", releaseWait)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// start prepares the slot, recreating it when it is missing or lost, and
// then begins the pending drain or the stream.
func (s *Source) start(ctx, term context.Context) error {
	pool, l, name := s.opts.Pool, s.layout, s.opts.Slot
	slot, err := inspectSlot(ctx, pool, name)
	if err != nil {
		return err
	}
	timeline, err := currentTimeline(ctx, pool)
	if err != nil {
		return err
	}
	if s.opts.MessagePrefix != "" {
		return s.startMessages(ctx, term, slot, timeline)
	}
	if slot.lost {
		s.log.Warn("replication slot lost: the WAL it needs was removed; recreating it and publishing the outbox backlog through the poll path",
			"slot", name)
		if err := dropSlot(ctx, pool, name); err != nil {
			return err
		}
	}
	if !slot.exists || slot.lost {
		reason := s.recreateReason(slot, timeline)
		if err := ensurePublication(ctx, pool, l, s.opts.Publication); err != nil {
			return err
		}
		if err := createSlot(ctx, pool, l, name, s.opts.Failover); err != nil {
			return err
		}
		if reason != "" {
			s.recreated[reason].Add(1)
		}
		s.resumeAt = 0
		s.log.Info("replication slot created", "slot", name, "recreated", reason != "", "reason", reason)
		if slot, err = inspectSlot(ctx, pool, name); err != nil {
			return err
		}
	}
	if timeline != s.timeline {
		s.resumeAt = 0 // positions of another timeline may name other transactions
	}
	s.timeline = timeline
	if s.fallback.Swap(false) {
		if err := recordDrain(ctx, pool, l, name); err != nil {
			return err
		}
	}
	to, pending, err := pendingDrain(ctx, pool, l, name)
	if err != nil {
		return err
	}
	if pending && to <= 0 { // the sequence was never used: nothing to drain
		if err := finishDrain(ctx, pool, l, name, to); err != nil {
			return err
		}
		pending = false
	}
	if redrain := s.redrain.Swap(false); pending && (redrain || to > s.drainedTo) {
		if s.drain, err = s.newDrain(ctx, to); err != nil {
			return err
		}
		s.draining.Store(true)
		if c, ok := s.drain.src.(*claim.Source); ok {
			s.drainClaims.Store(c) // a new claim source claims from the first seq
		}
		s.log.Info("publishing outbox rows committed before the slot existed through the poll path, then streaming",
			"slot", name, "drain_to_seq", to)
		return nil
	}
	if s.opts.Failover && !slot.failover {
		s.enableFailover(ctx)
	}
	s.st, err = s.openStream(ctx, term, max(slot.confirmed, s.resumeAt))
	if err == nil && s.redrain.Load() {
		s.st.fail(errRedrain) // Release ran while the stream opened
	}
	return err
}

// drainNext returns the drain's next batch; when the drain is over it
// removes the pending drain and returns nil.
func (s *Source) drainNext(ctx, term context.Context) (capture.Batch, error) {
	d := s.drain
	b, err := d.next(ctx, term)
	if err != nil {
		s.endDrain()
		return nil, err
	}
	if b != nil {
		return b, nil
	}
	if held := s.held.Len(); held > 0 || s.redrain.Load() {
		// The rows of held aggregates stay: so does the pending drain,
		// which a restart or Release runs again. (Release sets redrain
		// before it removes keys, so a pass that missed released rows
		// keeps it too.)
		s.drainedTo = d.to
		s.log.Info("outbox backlog published but for the aggregates held for broken destinations; streaming", "slot", s.opts.Slot,
			"events", d.events, "held_aggregates", held, "took", time.Since(d.began).Round(time.Millisecond))
		s.endDrain()
		return nil, nil
	}
	if err := finishDrain(ctx, s.opts.Pool, s.layout, s.opts.Slot, d.to); err != nil {
		return nil, err
	}
	s.log.Info("outbox backlog published; streaming", "slot", s.opts.Slot, "events", d.events,
		"took", time.Since(d.began).Round(time.Millisecond))
	s.endDrain()
	return nil, nil
}

func (s *Source) endDrain() {
	s.drainClaims.Store(nil)
	s.drain.src.Close()
	s.drain = nil
	s.draining.Store(false)
}

// openStream connects for replication and starts streaming from the slot
// at start.
func (s *Source) openStream(ctx, term context.Context, start pglogrepl.LSN) (*stream, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.opening.Store(&cancel)
	defer func() {
		s.opening.Store(nil)
		cancel(nil)
	}()
	cfg, reader := pacedConfig(s.repl, s.opts.Linger, s.pace)
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, permanentIfDenied(fmt.Errorf("open replication connection: %w", err))
	}
	every, err := statusEvery(ctx, conn, s.opts.StatusInterval)
	var replayTo pglogrepl.LSN
	if err == nil {
		replayTo, err = currentLSN(ctx, s.opts.Pool)
	}
	if err == nil {
		err = pglogrepl.StartReplication(ctx, conn, s.opts.Slot, start, pglogrepl.StartReplicationOptions{
			PluginArgs: s.pluginArgs()})
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		if hasCode(err, codeObjectInUse) {
			return nil, fmt.Errorf("replication slot %s is still used by another connection (a previous leader's?): %w", s.opts.Slot, err)
		}
		return nil, permanentIfDenied(fmt.Errorf("start replication from slot %s: %w", s.opts.Slot, err))
	}
	st := newStream(s, conn, start, replayTo, every)
	reader().caughtUp = st.caughtUp
	sctx, stop := context.WithCancelCause(term)
	st.stop, st.life = stop, sctx
	s.cur.Store(st)
	signal(s.guard.kick)
	s.wg.Go(func() {
		defer stop(nil)
		st.run(sctx)
	})
	if s.opts.ring() {
		s.wg.Go(func() { s.truncateRing(sctx) })
	}
	s.log.Info("streaming from replication slot", "slot", s.opts.Slot, "lsn", start.String(), "status_interval", every)
	return st, nil
}

// seqArchive returns the statements archiving published rows by seq, or
// nil when rows are archived by id: for the table-free outbox, an outbox
// without seq, or one whose seq no unique index covers (a row sharing a
// published row's seq would be archived with it).
func seqArchive(ctx context.Context, opts Options, l schema.Layout, info schema.Info) (*schema.SeqArchive, error) {
	if opts.MessagePrefix != "" || info.Lacks(l.Cols.Seq) || info.SeqSequence == "" {
		return nil, nil
	}
	_, unique, err := claim.InspectSeq(ctx, opts.Pool, l, info.SeqSequence)
	if err != nil || !unique {
		return nil, err
	}
	a := l.ArchiveBySeq(opts.ArchiveMode)
	return &a, nil
}

// pluginArgs returns pgoutput's options: protocol version 1 and the
// publication, and with Options.MessagePrefix the logical decoding
// messages.
func (s *Source) pluginArgs() []string {
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(schema.Q(s.opts.Publication))}
	if s.opts.MessagePrefix != "" {
		args = append(args, "messages 'true'")
	}
	return args
}

// quoteLiteral quotes s for an option of a replication command such as
// START_REPLICATION, whose parser only doubles quotes and knows no
// E-prefixed strings (so schema.Literal does not fit).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Reasons the source recreates its slot, the label values of
// SlotRecreated.
const (
	// RecreatedFailover: the slot this source used is missing and the
	// server's WAL timeline changed: a standby was promoted, and logical
	// slots are not copied to physical standbys (before PostgreSQL 17's
	// failover slots).
	RecreatedFailover = "failover"
	// RecreatedDropped: the slot this source used is missing on the same
	// timeline: someone dropped it.
	RecreatedDropped = "dropped"
	// RecreatedLost: the server invalidated the slot (wal_status lost).
	RecreatedLost = "lost"
)

// SlotRecreateReasons lists the reasons of SlotRecreated.
var SlotRecreateReasons = []string{RecreatedFailover, RecreatedDropped, RecreatedLost}

// SlotRecreated returns how many times this source recreated its slot for
// reason (one of SlotRecreateReasons) and drained the rows committed
// before it from the table. It is safe for concurrent use.
func (s *Source) SlotRecreated(reason string) int64 {
	if c, ok := s.recreated[reason]; ok {
		return c.Load()
	}
	return 0
}

// recreateReason returns why a missing or lost slot is recreated, logging a
// failover, or "" when this source never used the slot (its first start).
func (s *Source) recreateReason(slot slotInfo, timeline int64) string {
	switch {
	case slot.lost:
		return RecreatedLost
	case s.timeline == 0:
		return ""
	case timeline != s.timeline:
		s.log.Warn("replication slot missing on the new primary: failover; recreating it"+s.recreateThen(),
			"slot", s.opts.Slot, "timeline", timeline, "previous_timeline", s.timeline)
		return RecreatedFailover
	default:
		s.log.Warn("replication slot dropped; recreating it"+s.recreateThen(), "slot", s.opts.Slot)
		return RecreatedDropped
	}
}

// recreateThen says what follows a slot's recreation: the outbox rows
// committed before it are published from the table, while the messages of
// the table-free outbox committed meanwhile are lost.
func (s *Source) recreateThen() string {
	if s.opts.MessagePrefix != "" {
		return "; the outbox messages committed while it was missing are lost"
	}
	return " and publishing the outbox rows committed before it from the table"
}

// currentTimeline returns the server's current WAL timeline, which a
// promotion increments.
func currentTimeline(ctx context.Context, q schema.Querier) (int64, error) {
	var tl int64
	err := q.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tl)
	if err != nil {
		return 0, fmt.Errorf("read the server's WAL timeline: %w", err)
	}
	return tl, nil
}

// Hold notes that the pipeline leaves the events of aggregate key in the
// outbox (see capture.Holder): the batches completed with them left record
// them in the slot's pending drain, and drains skip them until Release.
func (s *Source) Hold(key string) { s.held.Add(key) }

// HoldsInOutbox reports whether the source may be used as a
// capture.Holder: not for the table-free outbox, nor for an outbox table
// without a column that a drain of held rows needs (see
// schema.Info.Missing), nor for archive mode partition, whose published
// rows stay in the outbox beside the held ones. For these the pipeline
// holds a broken destination's events in memory, and the slot with them.
func (s *Source) HoldsInOutbox() bool {
	return s.opts.MessagePrefix == "" && len(s.info.Missing) == 0 && !s.opts.ring()
}

// Release ends the hold of keys (see capture.Holder): the stream ends and,
// once the batches handed out before have settled (or after releaseWait),
// Next drains the outbox up to the pending drain's bound, which publishes
// the rows left for them in seq order, before streaming again. A drain
// running meanwhile claims them from the first seq again once no batch of
// its own that holds rows of theirs is unsettled: its cursor may be past
// the released rows (claims skipped them), and claiming on from it would
// publish their aggregates' newer rows first. The epoch is advanced before
// the drain's claims see the keys released, so that a claim that sees them
// is of the new epoch.
func (s *Source) Release(keys []string) uint64 {
	epoch := s.ledger.Advance()
	s.released.Store(epoch)
	s.redrain.Store(true)
	if c := s.drainClaims.Load(); c != nil {
		c.Release(keys)
	}
	s.held.Remove(keys)
	if st := s.cur.Load(); st != nil {
		st.fail(errRedrain)
	}
	return epoch
}

var errRedrain = errors.New("aggregates held for a broken destination were released: draining the outbox")

// Leading reports whether this relay is the one streaming (the others
// stand by). It is safe for concurrent use.
func (s *Source) Leading() bool { return s.lead.leading() }

// Close stops streaming, confirms what was archived, releases leadership
// and the connections. Batches not completed are abandoned: they are
// captured again after a restart.
func (s *Source) Close() error {
	s.stop()
	s.wg.Wait()
	s.arch.wait()
	s.drainedMu.Lock()
	open := slices.Collect(maps.Keys(s.unsettled))
	s.drainedMu.Unlock()
	for _, b := range open {
		b.Abandon(context.Background())
	}
	if s.drain != nil {
		s.endDrain()
	}
	s.st = nil
	s.pace.close()
	return nil
}

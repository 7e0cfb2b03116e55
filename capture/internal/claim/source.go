// Package claim captures outbox rows from the table itself: each batch is
// claimed with SELECT … FOR UPDATE SKIP LOCKED in seq order in a short
// transaction that commits before the batch is published, and its
// published rows are archived and its failed ones dead-lettered in another
// short transaction once the pipeline settled it. No transaction stays open
// while events are published; docs/design.md explains why order and
// exclusivity still hold.
//
// Both capture modes use it: capture/poll runs a Source as poll capture,
// and capture/wal runs one bounded by Options.MaxSeq to drain the rows
// committed before its replication slot. It is internal to capture, so
// neither mode's package imports the other.
//
// # Late commits
//
// seq values are taken when a row is inserted, but transactions commit in
// any order: a transaction holding seq 5 can still be open when one holding
// seq 6 has committed. Publishing 6 then would put an aggregate's newer event
// before an older one. Poll capture therefore only claims rows up to a safe
// watermark, computed like this on every poll:
//
//  1. H := the last value handed out by the seq column's sequence.
//  2. L := the transactions (virtual ids) that hold RowExclusiveLock on the
//     outbox table, i.e. every transaction that has inserted into it and is
//     still open. An INSERT takes that lock before it draws its seq value
//     and keeps it until the transaction ends.
//
// Every row with seq ≤ H was drawn by a transaction that either ended before
// step 2 (its rows are final) or is in L. So once no transaction of L holds
// the lock any more, every row with seq ≤ H is committed or gone, and rows
// up to H can be published in seq order. Pending (H, L) pairs are kept until
// they are released by a later read of L: the claiming transaction checks
// them in a statement of its own before the claim, so the claim's snapshot
// sees the rows of every writer that check found ended. Unlike a filter on
// xmin against the snapshot's xmin, this waits neither for unrelated long
// transactions nor misses a writer whose xid is newer than the committed
// row's; it waits only for open writers of the outbox.
//
// Reading L means reading pg_locks, which takes every lock-manager
// partition lock of the server, so most claims do without it: each seq is
// drawn once and a unique index on seq keeps any other row (one with a seq
// the application set) from taking the seq an open writer drew, so when
// every seq from the safe seq up to some s is visible, every row up to s is
// committed and the safe seq rises to s, never above H. A claim reads L
// only when the first seq above the safe seq has been missing for gapWait
// (its writer is still open, or rolled back and left a gap no row will
// fill), when this relay does not lease every partition (the rows
// other relays archived leave gaps), or on every claim when no unique index
// covers seq. A sequence that caches values per session (CACHE > 1) hands
// out seqs below H after H was read; New refuses it.
package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/wait"
)

// Options configures a Source. Pool, Layout, BatchSize, MaxBatchBytes,
// Interval, Linger, Partitions, ArchiveMode, ParkAggregates and Logger mean what
// the fields of poll.Options of those names mean (capture/poll documents
// them), with the same defaults, which New applies; MaxSeq and Join are
// the claim's own.
type Options struct {
	Pool                                 *pgxpool.Pool
	Layout                               schema.Layout
	BatchSize, MaxBatchBytes, Partitions int
	Interval, Linger                     time.Duration
	ArchiveMode                          string
	ParkAggregates                       bool
	Logger                               *slog.Logger
	// Held, when set, is the set of ordering keys whose rows claims skip
	// (see Hold); wal capture shares its own with its drains. Default: the
	// source's own set.
	Held *capture.HeldKeys
	// MaxSeq, when above zero, bounds the claims to rows with seq ≤ MaxSeq,
	// and Next returns ErrDrained once they are all claimed.
	// wal capture drains the rows older than its slot this way. Default 0:
	// no bound.
	MaxSeq int64
	// Join runs on the lease connection each time the source opens it,
	// before the source joins the relays on the outbox, with Partitions:
	// poll capture takes its capture configuration lock (schema.JoinMode)
	// there. An error closes the connection and Next returns it. Default
	// nil: nothing runs (wal capture's drain, whose relay holds its own
	// lock).
	Join func(ctx context.Context, conn *pgx.Conn, partitions int) error
}

// DefaultLinger is Options.Linger when it is not set.
const DefaultLinger = 5 * time.Millisecond

// DedicatedConns is how many connections a Source opens besides its pool:
// the lease connection.
const DedicatedConns = 1

// blockedInterval is the longest the poller waits while rows are held back
// by an open writer: a row becomes claimable one poll after the writers
// that were open when its seq was read have ended, and single-row
// transactions end within milliseconds. The wait keeps its pace while the
// run of empty claims held back by open writers is younger than
// blockedInterval, then doubles with every empty claim (see backOff), so
// open writers cost at most one claim per blockedInterval.
const blockedInterval = 10 * time.Millisecond

// gapInterval is the least time the first seq above the safe seq may be
// missing before a claim reads the open writers (safeBound): a writer's
// own single-row transaction mostly commits within it, and a rolled-back
// seq, which no row will ever fill, holds the rows behind it at least this
// long (see gapWait). After that read the writers are read again at most
// every blockedInterval while the gap stays.
const gapInterval = 2 * time.Millisecond

// busyInterval is the wait after a claim that found at least fillRows rows
// but did not fill a batch. Each claim that finds nothing doubles the wait,
// up to Options.Interval, so a steady trickle is picked up within a few
// milliseconds and an idle outbox costs a few queries a second.
const busyInterval = time.Millisecond

// fillRows is the fewest rows of a claim after which the poller looks again
// within busyInterval; after a claim that found fewer it waits
// Options.Linger: at a steady rate of small transactions each claim would
// otherwise take a few rows, every few milliseconds, and every claim is a
// transaction of its own in the database (a commit, a WAL flush) and a
// round trip and a few wakeups of the relay. Waiting Linger lets the rows
// of Linger gather in the next claim, at the cost of at most Linger of
// latency. Notifications (capture.poll.notify) do not end this wait.
const fillRows = 32

// Source is a capture.Source that claims rows from the outbox table. Next
// must be called from one goroutine; batches may be completed from others.
type Source struct {
	opts    Options
	log     *slog.Logger
	info    schema.Info
	sql     queries
	lease   leases
	marks   watermarks
	flight  inFlight    // rows of batches not settled yet
	folds   folds       // completions waiting for a claim (see fold.go)
	rel     releases    // see Hold and Release
	cursor  int64       // claims continue after this seq until reset
	rewind  atomic.Bool // set when rows below cursor may be claimable again
	idle    bool        // the last claim did not fill a batch
	few     bool        // the last claim found rows, fewer than fillRows
	blocked bool        // the last claim was held back by an open writer
	quiet   int         // claims in a row that found nothing
	// heldSince is when the current run of empty claims held back by open
	// writers began; zero outside such a run.
	heldSince time.Time
	from      int64 // the cursor the last claim started from
	limit     int   // see claimLimit
	// claimedTo is the safe seq that bounded the last claim.
	claimedTo int64
	// skipped is set when the last claim skipped rows another transaction
	// had locked: they are still to be claimed.
	skipped bool
	// gapAt is the first seq above the safe seq, when the last claim found
	// it missing although H is above it, and gapSince when a claim first
	// found it missing; 0 when no seq up to H is missing.
	gapAt    int64
	gapSince time.Time
	// gapFilled is how long the last missing seq took to appear by
	// itself, 0 when a read of the open writers released it (see gapWait).
	gapFilled time.Duration
	// locksAt is when a claim last read the open writers (see readWriters).
	locksAt time.Time
	// contiguous is set when a valid unique index covers the seq column
	// alone: then no row can take the seq an open writer drew, and the
	// safe seq may rise over visible seqs without reading pg_locks. Without
	// one an application's row with an explicit seq (OVERRIDING SYSTEM
	// VALUE) could fill an open writer's gap, so every claim reads the open
	// writers. Checked once, by New.
	contiguous bool
	// claimLost is set when the last claim failed and closed the lease
	// connection (see lostInClaim).
	claimLost bool
	// down is set while the source cannot capture (see Capturing): from
	// a lost lease connection or a failed Next until the lease connection
	// is up again or a claim works.
	down atomic.Bool
}

// ErrDrained is returned by Next, with Options.MaxSeq set, when a claim
// found no row although every row with seq ≤ MaxSeq is committed (no open
// writer holds one back), this relay leases every partition and the claim
// looked from the start, or batches are still open. Rows of open batches
// are not claimed again: once every batch was completed, a claim that again
// finds nothing means every row up to MaxSeq was published, dead-lettered
// or deleted.
// Calling Next again claims again.
var ErrDrained = errors.New("every outbox row up to the bound was claimed")

// New inspects the outbox table, creates the dead-letter table when it is
// missing and returns a source. A missing outbox table is a permanent error.
func New(ctx context.Context, opts Options) (*Source, error) {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 500
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = 8 << 20
	}
	if opts.Interval <= 0 {
		opts.Interval = 200 * time.Millisecond
	}
	if opts.Linger <= 0 {
		opts.Linger = DefaultLinger
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Partitions <= 0 {
		opts.Partitions = 16
	}
	info, err := schema.InspectSource(ctx, opts.Pool, opts.Layout, false)
	if err != nil {
		return nil, err
	}
	cache, unique, err := InspectSeq(ctx, opts.Pool, opts.Layout, info.SeqSequence)
	if err != nil {
		return nil, err
	}
	if cache > 1 && opts.MaxSeq == 0 {
		return nil, fault.AsPermanent(fmt.Errorf("sequence %s of outbox column %s hands out %d values at a time to each session (CACHE %d): "+
			"a session's cached values are used after later ones are committed, so poll capture cannot tell when every row below a seq is committed; "+
			"run ALTER SEQUENCE %s CACHE 1", info.SeqSequence, opts.Layout.Cols.Seq, cache, cache, info.SeqSequence))
	}
	if !unique && opts.MaxSeq == 0 {
		opts.Logger.Warn("no unique index covers the outbox's seq column alone, so every claim reads the open writers from pg_locks; "+
			"create one with CREATE UNIQUE INDEX CONCURRENTLY and restart", "table", opts.Layout.Outbox.String(), "column", opts.Layout.Cols.Seq)
	}
	if err := schema.EnsureDeadLetter(ctx, opts.Pool, opts.Layout, info); err != nil {
		return nil, err
	}
	if err := schema.EnsureArchive(ctx, opts.Pool, opts.Layout, opts.ArchiveMode, info); err != nil {
		return nil, err
	}
	s := &Source{opts: opts, log: opts.Logger, info: info, sql: buildQueries(opts.Layout, opts.ArchiveMode, opts.ParkAggregates, info.Types, opts.MaxBatchBytes),
		rel: releases{held: opts.Held}, contiguous: unique}
	s.forgetWatermark()
	if s.rel.held == nil {
		s.rel.held = new(capture.HeldKeys)
	}
	s.lease = leases{keys: newLockKeys(opts.Layout.Outbox.String()), n: opts.Partitions, log: opts.Logger,
		onGained: func() { s.rewind.Store(true) }}
	return s, nil
}

// InspectSeq returns the CACHE setting of the seq column's sequence seq and
// whether a valid, non-partial unique index covers the seq column alone.
// It reads only catalogs every role may read.
func InspectSeq(ctx context.Context, q schema.Querier, l schema.Layout, seq string) (cache int64, unique bool, err error) {
	err = q.QueryRow(ctx, `SELECT (SELECT seqcache FROM pg_sequence WHERE seqrelid = $1::regclass),
		EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
			WHERE i.indrelid = $2::regclass AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1
				AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $3)`,
		seq, l.Outbox.Ident(), l.Cols.Seq).Scan(&cache, &unique)
	if err != nil {
		return 0, false, fmt.Errorf("inspect the seq column of %s: %w", l.Outbox, err)
	}
	return cache, unique, nil
}

// Next claims the next batch of the partitions this relay leases, waiting
// while the outbox is idle or this relay holds no partition.
func (s *Source) Next(ctx context.Context) (capture.Batch, error) {
	b, err := s.next(ctx)
	if err != nil && ctx.Err() == nil && !errors.Is(err, ErrDrained) {
		s.down.Store(true)
	}
	return b, err
}

// Capturing reports whether the source can capture (capture.Health): its
// lease connection is up and the last claim on it worked, whether or not
// it found rows. An idle source claims every Options.Interval at most, so
// a lost connection shows within about that long. It is safe for
// concurrent use.
func (s *Source) Capturing() bool { return !s.down.Load() }

func (s *Source) next(ctx context.Context) (capture.Batch, error) {
	for {
		if err := s.connect(ctx); err != nil {
			return nil, err
		}
		if err := s.lease.rebalance(ctx); err != nil {
			s.disconnect(ctx)
			return nil, err
		}
		if len(s.lease.owned) == 0 {
			if err := wait.Sleep(ctx, rebalanceInterval); err != nil {
				return nil, err
			}
			continue
		}
		if s.idle {
			s.idle = false
			if err := s.wait(ctx); err != nil {
				return nil, err
			}
		}
		if err := s.flight.waitRoom(ctx, maxUnsettledBatches*s.opts.BatchSize, unsettledBatchBytes*s.opts.MaxBatchBytes); err != nil {
			return nil, err
		}
		if s.lease.conn == nil {
			continue // the wait lost the lease connection, on which the claim runs
		}
		b, err := s.claim(ctx)
		if err != nil && s.lostInClaim(err) {
			continue // Next reconnects and leases again
		}
		if err != nil {
			return nil, err
		}
		s.claimLost = false
		s.down.Store(false)
		if b != nil {
			return b, nil
		}
		if s.opts.MaxSeq > 0 {
			if s.drained() {
				return nil, ErrDrained
			}
			if s.from > 0 && s.flight.empty() {
				continue // rows below the cursor may be claimable again: look from the start
			}
		}
		s.idle = true
	}
}

// lostInClaim reports whether the failed claim's error err closed the lease
// connection, the first time in a row: the relay lost its leases, not the
// database, so it reconnects and leases again instead of failing Next. A
// second claim in a row that loses the connection returns its error.
func (s *Source) lostInClaim(err error) bool {
	if s.lease.conn != nil && !s.lease.conn.IsClosed() || s.claimLost {
		return false
	}
	s.claimLost = true
	s.log.Warn("a claim lost the lease connection; reconnecting", "err", err)
	s.disconnect(context.Background())
	return true
}

// drained reports whether the last claim, which found nothing, proves that
// every row up to MaxSeq was claimed (see ErrDrained). While batches are in
// flight a claim from the cursor is enough: the caller waits for them to
// settle and asks again, and then the claim looks from the start.
func (s *Source) drained() bool {
	return (s.from == 0 || !s.flight.empty()) && !s.skipped && len(s.lease.owned) == s.opts.Partitions && s.claimedTo >= s.opts.MaxSeq
}

// Close releases the lease connection, which gives up every partition.
func (s *Source) Close() error {
	if s.lease.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.lease.conn.Close(ctx)
}

// Partitions returns how many partitions this relay leases and claims, of
// all. It is safe for concurrent use.
func (s *Source) Partitions() (held, total int) {
	return int(s.lease.nOwned.Load()), s.opts.Partitions
}

// connect makes sure the lease connection is up: it LISTENs for inserts and
// holds this relay's membership and partition leases.
func (s *Source) connect(ctx context.Context) error {
	if s.lease.conn != nil && !s.lease.conn.IsClosed() {
		return nil
	}
	s.lease.lost()
	cfg := s.opts.Pool.Config().ConnConfig.Copy()
	// pgx prepares a claim's new statements before its transaction begins,
	// and preparing one waits for any lock an application holds on the
	// outbox: the server ends the wait before the client's bound, which
	// would close the connection (see claim).
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["statement_timeout"] = txLimitsArg
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect lease connection: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+schema.Q(s.opts.Layout.NotifyChannel())); err != nil {
		conn.Close(ctx)
		return fmt.Errorf("listen: %w", err)
	}
	if s.opts.Join != nil {
		if err := s.opts.Join(ctx, conn, s.opts.Partitions); err != nil {
			conn.Close(ctx)
			return err
		}
	}
	if err := s.lease.join(ctx, conn); err != nil {
		conn.Close(ctx)
		return err
	}
	s.forgetWatermark()
	s.down.Store(false)
	return nil
}

// forgetWatermark starts the safe seq again from nothing, as New does: a new
// lease connection may reach another server (a promoted standby, whose
// sequence may be behind the old primary's), and the first claim reads the
// open writers.
func (s *Source) forgetWatermark() {
	s.marks = watermarks{}
	s.gapAt, s.gapSince, s.locksAt = 1, time.Time{}, time.Time{}
}

// disconnect closes the lease connection after an error on it.
func (s *Source) disconnect(ctx context.Context) {
	s.down.Store(true)
	if s.lease.conn != nil {
		s.lease.conn.Close(context.WithoutCancel(ctx))
	}
	s.lease.lost()
}

// wait blocks for Options.Linger after a claim that found few rows (see
// fillRows), else until an
// insert is notified (with the trigger of capture.poll.notify), a
// completion waits for a claim (see fold.go), or the current poll interval
// passes: busyInterval after rows were found,
// doubling with every empty claim up to Options.Interval. The claim that
// follows drops the notifications received so far (dropNotifications).
func (s *Source) wait(ctx context.Context) error {
	if s.few && s.quiet == 0 {
		defer s.folds.claimStarts()() // the claim follows: completions wait for it (see foldWait)
		return wait.Sleep(ctx, s.opts.Linger)
	}
	wctx, cancel := context.WithTimeout(ctx, s.pause())
	defer cancel()
	if !s.folds.watch(cancel) {
		return nil // completions wait for the claim
	}
	defer s.folds.watch(nil)

	_, err := s.lease.conn.WaitForNotification(wctx)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && wctx.Err() == nil:
		s.disconnect(ctx) // Next reconnects
	}
	return nil
}

// dropNotifications drops the notifications the lease connection received
// so far, without reading from the server: they were sent after their
// transactions committed, so the claim about to start sees their rows.
// Claims run on the lease connection and read the notifications sent
// meanwhile, so dropping them before each claim keeps them bounded.
func (s *Source) dropNotifications(ctx context.Context) {
	done, stop := context.WithCancel(ctx)
	stop()
	for { // a done context returns the received notifications without reading
		if _, err := s.lease.conn.WaitForNotification(done); err != nil {
			return
		}
	}
}

// backOff records, at now, a claim that found nothing: the next wait
// doubles, unless rows are held back by open writers and the run of empty
// claims held back like this began less than blockedInterval ago. Such
// writers are most likely single-row transactions that end within
// milliseconds, so the poller keeps looking at the pace of the last wait;
// once the run is older, whether one writer stays open or short writers
// keep replacing each other, the wait doubles again, so they cost at most
// one claim per blockedInterval.
func (s *Source) backOff(now time.Time) {
	if !s.held() {
		s.heldSince = time.Time{}
		s.quiet++
		return
	}
	if s.heldSince.IsZero() {
		s.heldSince = now
	}
	if now.Sub(s.heldSince) >= blockedInterval {
		s.quiet++
	}
}

// pause returns how long wait waits at most: busyInterval after a claim
// that found rows, doubling with every empty claim up to Options.Interval,
// or up to blockedInterval while rows are held back by open writers, and
// at most gapWait while a missing seq waits for its first read of the
// open writers.
func (s *Source) pause() time.Duration {
	d := min(busyInterval<<min(s.quiet, 16), s.opts.Interval)
	if s.blocked {
		d = min(d, blockedInterval)
	}
	if s.gapAt > 0 && s.locksAt.Before(s.gapSince) {
		d = min(d, s.gapWait()) // the claim after it reads the writers (readWriters)
	}
	return d
}

// watermarks are the pending (H, L) pairs of the package doc.
type watermarks struct {
	safe    int64
	pending []watermark
}

type watermark struct {
	seq     int64
	writers []string
}

// maxPending bounds the pending list; beyond it the two oldest entries are
// merged, which only makes the wait longer, never shorter.
const maxPending = 64

// advance records the pair (h, writers), just read, releases the pending
// pairs none of whose writers is in writers any more, and raises the safe
// seq to the highest released one.
func (w *watermarks) advance(h int64, writers []string) {
	w.pending = append(w.pending, watermark{seq: h, writers: writers})
	keep := w.pending[:0]
	for _, m := range w.pending {
		if !overlaps(m.writers, writers) {
			w.safe = max(w.safe, m.seq)
		} else if m.seq > w.safe {
			m.writers = still(m.writers, writers)
			keep = append(keep, m)
		}
	}
	w.pending = keep
	if len(w.pending) > maxPending {
		a, b := w.pending[0], w.pending[1]
		w.pending[1] = watermark{seq: b.seq, writers: union(a.writers, b.writers)}
		w.pending = w.pending[1:]
	}
}

// flat returns the pending pairs as the safeBound statement's parameters: one
// element per pair and writer.
func (w *watermarks) flat() (seqs []int64, writers []string) {
	for _, m := range w.pending {
		for _, x := range m.writers {
			seqs, writers = append(seqs, m.seq), append(writers, x)
		}
	}
	return seqs, writers
}

// still returns the writers of a that are in open. A writer that is not
// open any more has ended, and a virtual transaction id is not reused, so
// it can be dropped from every pair: each pair keeps at most len(open).
func still(a, open []string) []string {
	if !slices.ContainsFunc(a, func(x string) bool { return !slices.Contains(open, x) }) {
		return a
	}
	var out []string
	for _, x := range a {
		if slices.Contains(open, x) {
			out = append(out, x)
		}
	}
	return out
}

// union returns the writers of a and b, each once, in a new slice.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// held reports whether rows are waiting for open writers.
func (w *watermarks) held() bool { return len(w.pending) > 0 }

// raise raises the safe seq to safe, found by other means than a release
// (every seq up to it is visible), and drops the pending pairs it covers.
func (w *watermarks) raise(safe int64) {
	if safe <= w.safe {
		return
	}
	w.safe = safe
	w.pending = slices.DeleteFunc(w.pending, func(m watermark) bool { return m.seq <= safe })
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

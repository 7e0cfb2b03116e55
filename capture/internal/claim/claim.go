package claim

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
)

// queries are the source's SQL, built once with quoted identifiers.
type queries struct {
	bound, boundOnly, lockWork, claim, claimAll, claimOne, claimOneAll, skipped, skippedAll, deadLetter, dropDead string
	archive                                                                                                       schema.SeqArchive
	// deadLetterCut is deadLetter keeping only the first characters of
	// long values (see schema.Layout.DeadLetterRow), for a row the
	// dead-letter table refused as it was.
	deadLetterCut string
}

func buildQueries(l schema.Layout, archiveMode string, park bool, types map[string]string, maxBytes int) queries {
	c, t := l.Cols, l.Outbox.Ident()
	seq := schema.Q(c.Seq)
	parked := ""
	if park {
		parked = fmt.Sprintf("AND NOT EXISTS (SELECT 1 FROM %s d WHERE %s)", l.DeadLetter.Ident(), l.SameKey("d", "o"))
	}
	partitionFilter := fmt.Sprintf("AND (hashtext(%s) & 2147483647) %% $4 = ANY($5::int[])", c.Key("o"))
	// The claim locks at most $3 rows in seq order, each column named c0,
	// c1, ... in schema.Columns.List order, then returns those of them
	// that begin before the rows before them reach maxBytes (claimBytes):
	// at least one.
	var inner, outer []string
	for i, name := range c.List() {
		inner = append(inner, fmt.Sprintf("o.%s AS c%d", schema.Q(name), i))
		col := fmt.Sprintf("c.c%d", i)
		if i == colID || i == colOrder {
			col += "::text"
		}
		outer = append(outer, col)
	}
	// held skips the rows of the ordering keys the pipeline holds in the
	// outbox (see capture.Holder), the parameter after skip's.
	held := func(skip int) string {
		return fmt.Sprintf("AND NOT coalesce(%s = ANY($%d::text[]), false)", c.Key("o"), skip+1)
	}
	claimSQL := func(filter string, skip int, size string) string {
		return fmt.Sprintf(`SELECT %s FROM (
			SELECT c.*, sum(c.relay_size) OVER (ORDER BY c.c%d ROWS UNBOUNDED PRECEDING) - c.relay_size AS relay_before FROM (
				SELECT %s, %s AS relay_size FROM %s o
				WHERE %s > $1 AND %s <= least($2, current_setting('relay.safe')::bigint) %s AND NOT %s = ANY($%d::bigint[]) %s %s %s
				ORDER BY %s LIMIT $3 FOR UPDATE SKIP LOCKED) c) c
			WHERE c.relay_before < %d ORDER BY c.c%d`,
			strings.Join(outer, ", "), colSeq, strings.Join(inner, ", "), size, t,
			seq, seq, filter, seq, skip, l.Unpublished(archiveMode, "o"), parked, held(skip), seq, maxBytes, colSeq)
	}
	// skippedSQL returns the statement that follows claimSQL(filter, skip)
	// in its transaction, with the same parameters: the rows among the
	// claim's first $3 candidates that it did not lock because another
	// transaction held a lock on them (their xmax is not this
	// transaction's id), with their ordering key and the greatest seq of
	// those candidates.
	skippedSQL := func(filter string, skip int) string {
		return fmt.Sprintf(`SELECT seq, k, top FROM (
			SELECT c.*, max(c.seq) OVER () AS top FROM (
				SELECT %s AS seq, %s AS k, o.xmax FROM %s o
				WHERE %s > $1 AND %s <= least($2, current_setting('relay.safe')::bigint) %s AND NOT %s = ANY($%d::bigint[]) %s %s %s
				ORDER BY %s LIMIT $3) c) w
			WHERE w.xmax::text IS DISTINCT FROM (pg_current_xact_id_if_assigned()::text::bigint %% 4294967296)::text`,
			"o."+seq, c.Key("o"), t, seq, seq, filter, seq, skip, l.Unpublished(archiveMode, "o"), parked, held(skip), seq)
	}
	// bound reads H into relay.h and raises relay.safe from $2 over the
	// contiguous seqs visible above it, up to H; boundOnly only reads H
	// (an outbox without a unique index on seq, see Source.contiguous).
	return queries{
		bound: fmt.Sprintf(`SELECT set_config('relay.h', h::text, true)::bigint,
			set_config('relay.safe', least(h, $2 + (SELECT coalesce(min(p.n) FILTER (WHERE p.seq <> $2 + p.n) - 1, count(*)) FROM (
				SELECT s.seq, row_number() OVER (ORDER BY s.seq) AS n FROM (
					SELECT %s AS seq FROM %s o WHERE %s > $2 ORDER BY %s LIMIT $3) s) p))::text, true)::bigint
			FROM (SELECT coalesce(pg_sequence_last_value($1::regclass), 0) AS h) h`,
			"o."+seq, t, "o."+seq, "o."+seq),
		boundOnly: `SELECT set_config('relay.h', coalesce(pg_sequence_last_value($1::regclass), 0)::text, true)::bigint,
			set_config('relay.safe', $2::bigint::text, true)::bigint`,
		lockWork: `SELECT pg_advisory_xact_lock_shared($1, p) FROM unnest($2::int[]) AS p`,
		claim:    claimSQL(partitionFilter, 6, claimBytes(c, types)),
		claimAll: claimSQL("", 4, claimBytes(c, types)),
		// A claim of one row takes it whatever its size: it sizes nothing.
		claimOne:      claimSQL(partitionFilter, 6, "0"),
		claimOneAll:   claimSQL("", 4, "0"),
		skipped:       skippedSQL(partitionFilter, 6),
		skippedAll:    skippedSQL("", 4),
		archive:       l.ArchiveBySeq(archiveMode),
		dropDead:      fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1::bigint[])`, t, seq),
		deadLetter:    deadLetterSQL(l, types, false),
		deadLetterCut: deadLetterSQL(l, types, true),
	}
}

// deadLetterSQL returns the statement copying the outbox rows of seqs $1
// to the dead-letter table with their failures ($2 to $6), with cut as
// for schema.Layout.DeadLetterRow.
func deadLetterSQL(l schema.Layout, types map[string]string, cut bool) string {
	row := l.DeadLetterRow(func(_ int, name string) string { return "o." + schema.Q(name) }, "d.error", types, cut)
	return fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.class, d.attempts, d.first_failed, d.last_failed
			FROM %s o JOIN unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::timestamptz[], $6::timestamptz[])
			AS d(seq, error, class, attempts, first_failed, last_failed) ON o.%s = d.seq`,
		l.DeadLetter.Ident(), l.Cols.Quoted(""), row, l.Outbox.Ident(), schema.Q(l.Cols.Seq))
}

// claimBytes returns the SQL expression of the bytes an outbox row o
// becomes (about event.Event.Size), reading as few stored values as it
// can: the length of text, varchar and bytea values (known without
// reading them), the stored size of small values of other types, and the
// text length of larger ones, whose stored size may be compressed far
// below it, plus event.Overhead. A claim also compares the sum of the rows
// it reads with their real sizes (see Source.claim), and stops there too.
func claimBytes(c schema.Columns, types map[string]string) string {
	parts := []string{strconv.Itoa(event.Overhead)}
	for _, name := range []string{c.Payload, c.Headers, c.AggregateType, c.AggregateID, c.EventType, c.OrderBy} {
		if name == "" {
			continue
		}
		v := "o." + schema.Q(name)
		size := fmt.Sprintf("CASE WHEN pg_column_size(%s) <= %d THEN pg_column_size(%s) ELSE octet_length(%s::text) END",
			v, storedExact, v, v)
		if t := types[name]; t == "text" || t == "bytea" || strings.HasPrefix(t, "character varying") {
			size = fmt.Sprintf("octet_length(%s)", v)
		}
		parts = append(parts, fmt.Sprintf("coalesce(%s, 0)", size))
	}
	return strings.Join(parts, " + ")
}

// storedExact is the largest stored size claimBytes takes for the size of
// a value that is not text, varchar or bytea: reading the text of every
// small value would cost more than the claim. A small value that
// PostgreSQL compressed is longer than its stored size; then the source's
// count of the rows it reads ends the claim (see Source.claim).
const storedExact = 1024

// claimOf returns the claim of the rows of partitions parts, of n, with
// seq above cursor and at most bound and the transaction's safe seq, not
// in skip and not of an ordering key in held, at most limit of them, the
// statement reading the rows it skipped (see skippedSQL), and their
// arguments. A claim of one row does not size it (see claimBytes). When
// parts holds every partition the claim does not compute each row's
// partition.
func (q queries) claimOf(parts []int32, n int, cursor, bound int64, limit int, skip []int64, held []string) (claim, skipped string, args []any) {
	if coversAll(parts, n) {
		claim = q.claimAll
		if limit == 1 {
			claim = q.claimOneAll
		}
		return claim, q.skippedAll, []any{cursor, bound, limit, skip, held}
	}
	claim = q.claim
	if limit == 1 {
		claim = q.claimOne
	}
	return claim, q.skipped, []any{cursor, bound, limit, n, parts, skip, held}
}

// coversAll reports whether parts holds every partition of n.
func coversAll(parts []int32, n int) bool {
	seen := make([]bool, n)
	left := n
	for _, p := range parts {
		if p >= 0 && int(p) < n && !seen[p] {
			seen[p] = true
			left--
		}
	}
	return left == 0
}

// txTimeout bounds every statement of the source's transactions and the
// time such a transaction may sit idle (SET LOCAL statement_timeout and
// idle_in_transaction_session_timeout), so that not even a bug can keep
// one open for long; the client gives up after twice as long.
const txTimeout = 5 * time.Second

// begin starts every transaction of the source at READ COMMITTED,
// whatever default_transaction_isolation says, so that each statement takes
// its own snapshot: the claim's rows must be read after safeBound released the
// writers it found ended, and the archive, which only touches rows this
// relay claimed, never fails on a serialization conflict.
const begin = "BEGIN ISOLATION LEVEL READ COMMITTED"

// txLimits is the first statement of every transaction of the source, with
// txLimitsArg and planMode of the transaction's arrays.
const txLimits = `SELECT set_config('statement_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true),
	set_config('plan_cache_mode', $2, true)`

var txLimitsArg = strconv.FormatInt(txTimeout.Milliseconds(), 10)

// planMode returns the plan_cache_mode of a transaction whose statements
// take arrays of n elements together: above hashedArray the statements are
// planned with their parameters' values, so that PostgreSQL 14 and later
// look the arrays' elements (rows in flight, a batch's seqs) up in a hash
// table; otherwise they run the plan each connection keeps for each of
// them, since planning a claim costs the server more than searching a short
// array row by row.
func planMode(n int) string {
	if n > hashedArray {
		return "force_custom_plan"
	}
	return "force_generic_plan"
}

// hashedArray is the most elements of the arrays of a transaction that
// planMode leaves to a kept plan.
const hashedArray = 64

// safeBound runs, when the claim reads the open writers (see
// Source.readWriters), after the bound statement and before the claim, as a
// statement of its own so that the claim's snapshot is taken after it. It
// reads L, the open writers of the outbox ($1), from pg_locks and releases
// the pending watermarks ($2 seqs, $3 their writers, one element per
// writer) none of whose writers is open any more; it raises the
// transaction's relay.safe setting, which bounds the claim, to the highest
// released seq, or to H (relay.h) when no writer is open.
const safeBound = `WITH locks AS (
	SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') AS open FROM pg_locks
	WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'RowExclusiveLock' AND pid IS DISTINCT FROM pg_backend_pid()
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), released AS (
	SELECT max(seq) AS seq FROM (SELECT u.seq FROM unnest($2::bigint[], $3::text[]) AS u(seq, vx), locks
		GROUP BY u.seq HAVING NOT bool_or(u.vx = ANY(locks.open))) r
)
SELECT open, set_config('relay.safe', greatest(current_setting('relay.safe')::bigint, released.seq,
	CASE WHEN cardinality(open) = 0 THEN current_setting('relay.h')::bigint END)::text, true)::bigint
FROM locks, released`

// claim claims the next rows up to the safe watermark in one round trip on
// the lease connection, whose session holds this relay's partition leases
// (so a claim commits only while they are held): a short transaction that
// takes the work locks, works out the safe seq, runs the statements of the
// completions waiting for it (see fold.go), claims and commits; see
// docs/design.md. It returns nil when there are none.
//
// The claim does not end when ctx does: pgx closes a connection whose
// query a context interrupts, which would give up the leases, so the
// claim runs to its end, bounded by txTimeout on the server (the lease
// connection's statement_timeout bounds the preparing of its statements,
// outside its transaction) and twice that on the client. A claim whose
// folded statements failed (an archive refused, a row lock waited for
// foldLockTimeout) or that waited foldLockTimeout itself is tried again
// without them, with a bound of its own, so a completion's failure is
// never the claim's; after any other failure the completions run on their
// own and the next claim comes in the next cycle.
func (s *Source) claim(ctx context.Context) (*batch, error) {
	defer s.folds.claimStarts()()
	taken := s.folds.take(hashedArray)
	var foldFailed bool
	b, err := s.claimWith(ctx, taken, &foldFailed)
	settle(taken, err)
	if err != nil && (foldFailed || pgerr.LockNotAvailable(err)) && s.lease.conn != nil && !s.lease.conn.IsClosed() { // rollback may have closed it
		return s.claimWith(ctx, nil, &foldFailed) // without the completions, which run on their own
	}
	return b, err
}

// claimWith is claim with the statements of the folded completions taken
// in its transaction (see fold.go).
func (s *Source) claimWith(ctx context.Context, taken []*fold, foldFailed *bool) (*batch, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*txTimeout)
	defer cancel()
	s.dropNotifications(ctx)
	epoch, held, released := s.rel.begin()
	if s.rewind.Swap(false) || released {
		s.cursor = 0
	}
	s.from = s.cursor
	b := &batch{s: s}
	bound := int64(math.MaxInt64)
	if s.opts.MaxSeq > 0 {
		bound = s.opts.MaxSeq
	}
	limit := s.claimLimit()
	skip := s.flight.above(s.cursor)
	n := len(skip) + len(held)
	for _, w := range taken {
		n += w.n
	}
	var r readings
	br := s.prepare(&r, limit, n)
	queueFolds(br, taken, foldFailed) // before the claim, which sees their dead-lettered (parked) aggregates
	sql, skippedSQL, args := s.sql.claimOf(s.lease.owned, s.opts.Partitions, s.cursor, bound, limit, skip, held)
	br.Queue(sql, args...).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if b.bytes >= s.opts.MaxBatchBytes {
					continue // the server's count was short (compressed values): the rest stay for the next claim
				}
				if err := b.scan(rows, s.info.ContentType); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	var skipped []skippedRow
	br.Queue(skippedSQL, args...).Query(func(rows pgx.Rows) error {
		var r skippedRow
		_, err := pgx.ForEachRow(rows, []any{&r.seq, &r.key, &r.top}, func() error {
			skipped = append(skipped, r)
			return nil
		})
		return err
	})
	br.Queue("COMMIT")
	if err := s.lease.conn.SendBatch(ctx, br).Close(); err != nil {
		s.limit = max(limit/4, 1) // e.g. a statement timeout sizing large rows
		s.rollback(ctx)
		return nil, fmt.Errorf("claim: %w", err)
	}
	s.recordReadings(&r, bound, time.Now())
	least := b.holdBack(skipped)
	s.skipped = least > 0
	n = len(b.seqs)
	s.idle = n < limit
	s.few = n > 0 && n < fillRows
	s.limit = limit * 2
	if b.bytes >= s.opts.MaxBatchBytes {
		s.limit = n
	}
	s.blocked = s.held()
	if n == 0 {
		s.cursor = 0
		s.backOff(time.Now())
		return nil, nil
	}
	s.quiet, s.heldSince = 0, time.Time{}
	s.cursor = b.last
	if s.skipped {
		s.cursor = least - 1 // come back for the skipped rows
	}
	s.flight.add(b.seqs, b.bytes)
	b.epoch = epoch
	s.rel.add(b)
	return b, nil
}

// skippedRow is a row among a claim's candidates that another transaction
// had locked (an application's UPDATE, a foreign key check's FOR KEY SHARE),
// so the claim's SKIP LOCKED passed it; top is the greatest seq of the
// candidates.
type skippedRow struct {
	seq, top int64
	key      *string
}

// holdBack drops from the batch what it must not hand over when the claim
// skipped rows: the events of each skipped row's ordering key newer than
// it, which would otherwise be published before it, and every row above
// the candidates' greatest seq, where skipped rows are not known. The rows
// dropped stay in the outbox and are claimed again. holdBack returns the
// least skipped seq, 0 when none was skipped.
func (b *batch) holdBack(skipped []skippedRow) int64 {
	if len(skipped) == 0 {
		return 0
	}
	top, least := skipped[0].top, skipped[0].seq
	first := make(map[string]int64, len(skipped))
	for _, r := range skipped {
		least = min(least, r.seq)
		if r.key == nil {
			continue // a row without a key is dead-lettered, it holds nothing back
		}
		if f, ok := first[*r.key]; !ok || r.seq < f {
			first[*r.key] = r.seq
		}
	}
	dropped := make(map[int64]bool)
	b.events = slices.DeleteFunc(b.events, func(ev *event.Event) bool {
		seq := int64(ev.Position)
		f, held := first[ev.Key()]
		drop := seq > top || held && seq > f
		dropped[seq] = drop
		if drop {
			b.bytes -= ev.Size()
		}
		return drop
	})
	b.bad = slices.DeleteFunc(b.bad, func(d capture.DeadEvent) bool {
		drop := int64(d.Event.Position) > top
		dropped[int64(d.Event.Position)] = drop
		if drop {
			b.bytes -= d.Event.Size()
		}
		return drop
	})
	b.seqs = slices.DeleteFunc(b.seqs, func(seq int64) bool { return dropped[seq] })
	return least
}

// claimLimit returns how many rows the next claim locks and sizes at most:
// BatchSize, or after a claim whose rows reached MaxBatchBytes as many rows
// as it took, so that claims of large rows do not size rows they do not
// take; it doubles after every claim that did not reach MaxBatchBytes, and
// falls to a quarter after a failed claim.
func (s *Source) claimLimit() int {
	if s.limit <= 0 || s.limit > s.opts.BatchSize {
		s.limit = s.opts.BatchSize
	}
	return s.limit
}

// rollback ends the transaction a failed claim left open on the lease
// connection; when that fails too, it closes the connection (Next
// reconnects), which gives up the leases.
func (s *Source) rollback(ctx context.Context) {
	conn := s.lease.conn
	if conn.IsClosed() || conn.PgConn().TxStatus() == 'I' {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		s.disconnect(ctx)
	}
}

// readings are what one claim's round trip read besides the rows: H, the
// safe seq that bounded the claim, and, when it read them (locks), the open
// writers L.
type readings struct {
	locks bool
	head  int64
	safe  int64
	open  []string
	// visible is the safe seq of the bound statement, over visible seqs,
	// before safeBound raised it.
	visible int64
	// from is the safe seq the bound statement started from, and limit the
	// most seqs above it it looked at.
	from  int64
	limit int
}

// prepare returns the claiming transaction up to its claim of at most limit
// rows, whose arrays of rows in flight and held keys hold n elements: it
// begins, takes the work locks of the owned partitions (see Scale-out in
// lease.go), reads H and raises the safe seq over the seqs above it that
// are all visible, and, when readWriters says so, runs safeBound with the
// pending watermarks.
func (s *Source) prepare(r *readings, limit, n int) *pgx.Batch {
	br := &pgx.Batch{}
	br.Queue(begin)
	br.Queue(txLimits, txLimitsArg, planMode(n))
	br.Queue(s.sql.lockWork, s.lease.keys.work, s.lease.owned)
	scan := func(row pgx.Row) error {
		err := row.Scan(&r.head, &r.safe)
		r.visible = r.safe
		return err
	}
	if s.contiguous {
		br.Queue(s.sql.bound, s.info.SeqSequence, s.marks.safe, limit).QueryRow(scan)
	} else {
		br.Queue(s.sql.boundOnly, s.info.SeqSequence, s.marks.safe).QueryRow(scan)
	}
	r.from, r.limit = s.marks.safe, limit
	if now := time.Now(); s.readWriters(now) {
		r.locks, s.locksAt = true, now
		seqs, writers := s.marks.flat()
		br.Queue(safeBound, s.opts.Layout.Outbox.Ident(), seqs, writers).
			QueryRow(func(row pgx.Row) error { return row.Scan(&r.open, &r.safe) })
	}
	return br
}

// readWriters reports whether the claim at now reads the open writers of
// the outbox (safeBound): always when the seq column has no unique index
// (see Source.contiguous), while this relay does not lease every partition
// (the rows other relays archived leave gaps in the seqs it sees), and once
// the first seq above the safe seq has been missing for gapWait (its
// writer rolled back, failed, or is still open), then again every
// blockedInterval while it stays missing. Otherwise the safe seq only
// rises over visible seqs, which needs no read of pg_locks; the pairs a
// read left pending wait for the next read, which a seq missing as long
// brings about.
func (s *Source) readWriters(now time.Time) bool {
	if !s.contiguous || !coversAll(s.lease.owned, s.opts.Partitions) {
		return true
	}
	if s.gapAt == 0 || now.Sub(s.gapSince) < s.gapWait() {
		return false
	}
	return s.locksAt.Before(s.gapSince) || now.Sub(s.locksAt) >= blockedInterval
}

// gapWait returns how long the first seq above the safe seq may be missing
// before a claim reads the open writers: twice as long as the last missing
// seq took to appear by itself (its writer committed), between gapInterval
// and blockedInterval, or gapInterval after a read of the writers released
// a missing seq (a rolled-back one, which no writer fills). While writers
// keep seqs missing for a few milliseconds (a busy database, claims a few
// milliseconds apart) the claims thus mostly find the seq filled instead of
// reading pg_locks for it; a rolled-back seq then holds the rows behind it
// up to blockedInterval longer.
func (s *Source) gapWait() time.Duration {
	return min(max(2*s.gapFilled, gapInterval), blockedInterval)
}

// recordReadings records, at now, what a claim bounded by bound read: the
// safe seq it used, the (H, L) pair when it read L, and whether a seq above
// the safe seq is missing (gapAt). A bound statement that found every seq
// it looked at visible found no missing one, whatever H says.
func (s *Source) recordReadings(r *readings, bound int64, now time.Time) {
	s.claimedTo = min(r.safe, bound)
	s.marks.raise(r.safe)
	if r.locks {
		s.marks.advance(r.head, r.open)
	}
	if s.gapAt > 0 && s.marks.safe >= s.gapAt && !s.gapSince.IsZero() {
		s.gapFilled = 0 // released by a read of the writers
		if r.visible >= s.gapAt {
			s.gapFilled = now.Sub(s.gapSince)
		}
	}
	switch {
	case r.head <= s.marks.safe || s.contiguous && s.marks.safe >= r.from+int64(r.limit):
		s.gapAt = 0
	case s.gapAt != s.marks.safe+1:
		s.gapAt, s.gapSince = s.marks.safe+1, now
	}
}

// held reports whether rows may be waiting for writers: pending
// watermarks, or a missing seq above the safe seq.
func (s *Source) held() bool { return s.marks.held() || s.gapAt > 0 }

// batch is a claimed set of rows. Its rows are not locked: this relay
// leases their partitions and does not claim them again while the batch is
// in flight.
type batch struct {
	s      *Source
	events []*event.Event
	bad    []capture.DeadEvent // rows that cannot become events
	seqs   []int64             // every claimed row
	last   int64
	bytes  int      // the claimed rows' size (event.Event.Size)
	sc     *scanner // reads the claim's rows
	epoch  uint64   // the release epoch its claim began in (see capture.Holder)
}

// Epoch returns the release epoch the batch's claim began in (see
// capture.Holder).
func (b *batch) Epoch() uint64 { return b.epoch }

// Events returns the claimed events in seq order.
func (b *batch) Events() []*event.Event { return b.events }

func fill(ev *event.Event, id, aggType, aggID, evType *string, headers []byte, created *time.Time) error {
	if id == nil {
		return fmt.Errorf("id is NULL")
	}
	u, err := uuid.Parse(*id)
	if err != nil {
		return fmt.Errorf("id %q is not a UUID", *id)
	}
	ev.ID = u.String()
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"aggregate_type", aggType, &ev.AggregateType}, {"aggregate_id", aggID, &ev.AggregateID}, {"event_type", evType, &ev.EventType}} {
		if f.v == nil {
			return fmt.Errorf("%s is NULL", f.name)
		}
		*f.dst = *f.v
	}
	if created != nil {
		ev.CreatedAt = *created
	}
	if headers != nil {
		var err error
		if ev.Headers, err = event.ParseHeaders(headers); err != nil {
			return fmt.Errorf("headers must be a JSON object of strings: %v", err)
		}
	}
	return nil
}

// Complete archives the published rows and moves the dead ones to the
// dead-letter table in one short transaction, or, when a statement of it
// fails, row by row (see settleApart). When it fails, or when the
// pipeline left rows in the outbox (neither published nor dead, see
// dead_letter.park_aggregate) of aggregates it does not hold (see Hold:
// Release looks again for those), the next claim starts from the first seq
// again, so those rows are claimed again before any newer row of their
// aggregates.
func (b *batch) Complete(ctx context.Context, o capture.Outcome) error {
	err := b.complete(ctx, o)
	unheld := b.leftUnheld(o)
	b.s.flight.remove(b.seqs, b.bytes)
	b.s.rel.settle(b)
	if err != nil || unheld {
		b.s.rewind.Store(true)
	}
	return err
}

// leftUnheld reports whether o leaves events of b in the outbox whose
// aggregates are not held.
func (b *batch) leftUnheld(o capture.Outcome) bool {
	for _, i := range o.Left(b.events) {
		if !b.s.rel.held.Has(b.events[i].Key()) {
			return true
		}
	}
	return false
}

// complete runs the statements of o (see statements): in the next claim
// when they are few (see fold.go), else in a transaction of their own.
// When a statement of it fails and o has dead rows, it settles the rows
// apart (see settleApart).
func (b *batch) complete(ctx context.Context, o capture.Outcome) error {
	stmts, n := b.statements(o)
	if n == 0 || n <= hashedArray && b.s.folds.run(ctx, stmts, n) {
		return nil
	}
	err := b.s.runTx(ctx, stmts, n)
	dead := b.dead(o)
	if err == nil || len(dead) == 0 || pgerr.Of(err) == nil || ctx.Err() != nil {
		return err // without a failed statement the database is out of reach
	}
	return b.settleApart(ctx, o.Published, dead)
}

// runTx runs stmts, whose arrays hold n elements, in a transaction of
// their own.
func (s *Source) runTx(ctx context.Context, stmts []statement, n int) error {
	br := &pgx.Batch{}
	br.Queue(begin)
	br.Queue(txLimits, txLimitsArg, planMode(n))
	for _, st := range stmts {
		br.Queue(st.sql, st.args...)
	}
	br.Queue("COMMIT")
	ctx, cancel := context.WithTimeout(ctx, 2*txTimeout)
	defer cancel()
	conn, err := s.opts.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("archive %d rows: %w", n, err)
	}
	defer conn.Release() // rolls back when the batch failed inside the transaction
	if err := conn.SendBatch(ctx, br).Close(); err != nil {
		return fmt.Errorf("archive %d rows: %w", n, err)
	}
	return nil
}

// settleApart settles the rows of a batch whose statements failed
// together: the published rows in a transaction, then each dead row in a
// transaction of its own (see deadLetterAlone). A row that fails to settle
// thus holds back no other: it alone stays in the outbox and is claimed
// again (with the backoff of the failed archive). It returns the first
// failure, nil when every row settled, and stops at a failure that says
// the next row would wait as long (pgerr.Stalled: a lock or statement
// timeout, the database out of reach).
func (b *batch) settleApart(ctx context.Context, published []*event.Event, dead []capture.DeadEvent) error {
	var first error
	if len(published) > 0 {
		first = b.s.runTx(ctx, []statement{b.archiveStatement(published)}, len(published))
	}
	for _, d := range dead {
		err := b.deadLetterAlone(ctx, d)
		if pgerr.Stalled(err) {
			return err // the next row would wait as long: it waits for the next claim
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// deadLetterAlone moves the dead row d to the dead-letter table in a
// transaction of its own. When the table refuses the row for its values
// (pgerr.RowValue: an index of an earlier release that cannot hold a long
// aggregate id, a bounded column), it keeps the row with its long values
// cut (schema.Layout.DeadLetterRow) and the refusal in its error, so that
// the row leaves the outbox without losing its payload.
func (b *batch) deadLetterAlone(ctx context.Context, d capture.DeadEvent) error {
	one := []capture.DeadEvent{d}
	err := b.s.runTx(ctx, b.deadStatements(one, b.s.sql.deadLetter), 1)
	if err == nil || !pgerr.RowValue(err) {
		return err
	}
	one[0].Err = schema.RefusedError(d.Err, err)
	if err := b.s.runTx(ctx, b.deadStatements(one, b.s.sql.deadLetterCut), 1); err != nil {
		return err
	}
	b.s.log.Warn("the dead-letter table refused a row as it was; it keeps the row with its long values cut",
		"seq", d.Event.Position, "refusal", err.Error())
	return nil
}

// dead returns the rows of b that go to the dead-letter table with
// outcome o: o's dead events and the rows that could not become events.
func (b *batch) dead(o capture.Outcome) []capture.DeadEvent {
	return append(slices.Clip(o.Dead), b.bad...)
}

// statements returns the statements that settle the batch with outcome o:
// they move its dead events to the dead-letter table and archive its
// published ones; n counts those rows.
func (b *batch) statements(o capture.Outcome) (stmts []statement, n int) {
	dead := b.dead(o)
	if len(dead) > 0 {
		stmts = b.deadStatements(dead, b.s.sql.deadLetter)
	}
	if len(o.Published) > 0 {
		stmts = append(stmts, b.archiveStatement(o.Published))
	}
	return stmts, len(o.Published) + len(dead)
}

// deadStatements returns the statements moving the dead rows to the
// dead-letter table with insert (queries.deadLetter or deadLetterCut).
func (b *batch) deadStatements(dead []capture.DeadEvent, insert string) []statement {
	seqs := make([]int64, len(dead))
	for i, d := range dead {
		seqs[i] = int64(d.Event.Position)
	}
	return []statement{{insert, deadArgs(dead)}, {b.s.sql.dropDead, []any{seqs}}}
}

// archiveStatement returns the statement archiving the published events.
func (b *batch) archiveStatement(published []*event.Event) statement {
	seqs := make([]int64, len(published))
	for i, ev := range published {
		seqs[i] = int64(ev.Position)
	}
	sql, args := b.s.sql.archive.Of(seqs)
	return statement{sql, args}
}

func deadArgs(dead []capture.DeadEvent) []any {
	n := len(dead)
	seqs, errs, classes := make([]int64, n), make([]string, n), make([]string, n)
	attempts, first, last := make([]int32, n), make([]time.Time, n), make([]time.Time, n)
	for i, d := range dead {
		seqs[i], errs[i], classes[i] = int64(d.Event.Position), rowtext.Error(d.Err), d.Class
		attempts[i] = int32(d.Attempts)
		first[i], last[i] = time.Unix(0, d.FirstFailed), time.Unix(0, d.LastFailed)
	}
	return []any{seqs, errs, classes, attempts, first, last}
}

// Abandon leaves the batch's rows in the outbox; they are claimed again
// later.
func (b *batch) Abandon(context.Context) {
	b.s.flight.remove(b.seqs, b.bytes)
	b.s.rel.settle(b)
	b.s.rewind.Store(true)
}

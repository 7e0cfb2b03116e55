package poll

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
)

// queries are the source's SQL, built once with quoted identifiers.
type queries struct {
	lastSeq, writers, lockWork, leased, claim, archive, deadLetter, dropDead string
}

func buildQueries(l schema.Layout, archiveMode string, park bool) queries {
	c, t := l.Cols, l.Outbox.Ident()
	seq := schema.Q(c.Seq)
	parked := ""
	if park {
		parked = fmt.Sprintf("AND NOT EXISTS (SELECT 1 FROM %s d WHERE d.%s = o.%s)",
			l.DeadLetter.Ident(), schema.Q(c.AggregateID), schema.Q(c.AggregateID))
	}
	return queries{
		lastSeq: `SELECT coalesce(pg_sequence_last_value($1::regclass), 0)`,
		writers: `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
			WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'RowExclusiveLock'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND pid IS DISTINCT FROM pg_backend_pid()`,
		lockWork: `SELECT pg_advisory_xact_lock_shared($1, p) FROM unnest($2::int[]) AS p`,
		leased: `SELECT coalesce(array_agg(objid::int), '{}') FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND pid = $2 AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND classid = $1::int::oid AND objid::int = ANY($3::int[])`,
		claim: fmt.Sprintf(`SELECT %s FROM %s o
			WHERE %s > $1 AND %s <= $2 AND (hashtext(%s) & 2147483647) %% $4 = ANY($5::int[]) %s %s
			ORDER BY %s LIMIT $3 FOR UPDATE SKIP LOCKED`,
			strings.Replace(c.Quoted("o"), "o."+schema.Q(c.ID), "o."+schema.Q(c.ID)+"::text", 1), t, seq, seq,
			schema.Q(c.AggregateID), l.Unpublished(archiveMode, "o"), parked, seq),
		archive:  l.ArchiveByKey(archiveMode, c.Seq, "bigint"),
		dropDead: fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1::bigint[])`, t, seq),
		deadLetter: fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.error, d.class, d.attempts, d.first_failed, d.last_failed
			FROM %s o JOIN unnest($1::bigint[], $2::text[], $3::text[], $4::int[], $5::timestamptz[], $6::timestamptz[])
			AS d(seq, error, class, attempts, first_failed, last_failed) ON o.%s = d.seq`,
			l.DeadLetter.Ident(), c.Quoted(""), c.Quoted("o"), t, seq),
	}
}

// claim opens a transaction and locks the next rows up to the safe
// watermark. It returns nil when there are none.
func (s *Source) claim(ctx context.Context) (capture.Batch, error) {
	tx, err := s.opts.Pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	b, err := s.claimIn(ctx, tx)
	if err != nil || b == nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return b, nil
}

func (s *Source) claimIn(ctx context.Context, tx pgx.Tx) (*batch, error) {
	safe, parts, err := s.prepare(ctx, tx)
	if err != nil {
		return nil, err
	}
	if len(parts) < len(s.lease.owned) {
		s.log.Warn("partition leases lost; claiming stops until they are leased again",
			"leased", len(parts), "owned", len(s.lease.owned))
		s.disconnect(ctx)
		if len(parts) == 0 {
			return nil, nil
		}
	}
	if s.rewind.Swap(false) {
		s.cursor = 0
	}
	if s.opts.MaxSeq > 0 {
		safe = min(safe, s.opts.MaxSeq)
	}
	s.from = s.cursor
	rows, err := tx.Query(ctx, s.sql.claim, s.cursor, safe, s.opts.BatchSize, s.opts.Partitions, parts)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	b := &batch{s: s, tx: tx}
	for rows.Next() {
		if err := b.scan(rows, s.info.ContentType); err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	n := len(b.events) + len(b.bad)
	s.idle = n < s.opts.BatchSize
	s.blocked = s.marks.held()
	if n == 0 {
		s.cursor = 0
		s.quiet++
		return nil, nil
	}
	s.quiet = 0
	s.cursor = b.last
	return b, nil
}

// prepare takes the work locks of the owned partitions, checks which of
// them this relay still leases (see Scale-out in lease.go), and reads H and
// L (see the package doc), in one round trip. It returns the safe seq and
// the partitions to claim.
func (s *Source) prepare(ctx context.Context, tx pgx.Tx) (int64, []int32, error) {
	var h int64
	var writers []string
	var parts []int32
	k := s.lease.keys
	br := &pgx.Batch{}
	br.Queue(s.sql.lockWork, k.work, s.lease.owned)
	br.Queue(s.sql.leased, k.lease, s.lease.pid, s.lease.owned).QueryRow(func(r pgx.Row) error { return r.Scan(&parts) })
	br.Queue(s.sql.lastSeq, s.info.SeqSequence).QueryRow(func(r pgx.Row) error { return r.Scan(&h) })
	br.Queue(s.sql.writers, s.opts.Layout.Outbox.Ident()).QueryRow(func(r pgx.Row) error { return r.Scan(&writers) })
	if err := tx.SendBatch(ctx, br).Close(); err != nil {
		return 0, nil, fmt.Errorf("prepare claim: %w", err)
	}
	return s.marks.advance(h, writers), parts, nil
}

// batch is a claimed set of rows and the transaction that locks them.
type batch struct {
	s      *Source
	tx     pgx.Tx
	events []*event.Event
	bad    []capture.DeadEvent // rows that cannot become events
	last   int64
}

// Events returns the claimed events in seq order.
func (b *batch) Events() []*event.Event { return b.events }

// scan reads one row into an event, or into bad when the row is malformed.
func (b *batch) scan(rows pgx.Rows, contentType string) error {
	var (
		id, aggType, aggID, evType *string
		payload, headers           []byte
		created                    *time.Time
		seq                        int64
	)
	if err := rows.Scan(&id, &aggType, &aggID, &evType, &payload, &headers, &created, &seq); err != nil {
		return err
	}
	b.last = seq
	ev := &event.Event{Payload: payload, ContentType: contentType, Position: uint64(seq)}
	err := fill(ev, id, aggType, aggID, evType, headers, created)
	if err == nil && payload == nil {
		err = fmt.Errorf("payload is NULL")
	}
	if err != nil {
		now := time.Now().UnixNano()
		b.bad = append(b.bad, capture.DeadEvent{Event: ev, Err: "bad row: " + err.Error(), Class: "permanent",
			Attempts: 1, FirstFailed: now, LastFailed: now})
		b.s.log.Error("bad outbox row, moved to the dead-letter table", "seq", seq, "message_id", ev.ID, "err", err)
		return nil
	}
	b.events = append(b.events, ev)
	return nil
}

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

// Complete deletes the published rows and moves the dead ones to the
// dead-letter table, then commits the claiming transaction.
func (b *batch) Complete(ctx context.Context, o capture.Outcome) error {
	err := b.complete(ctx, o)
	if err != nil {
		b.tx.Rollback(context.WithoutCancel(ctx))
		b.s.rewind.Store(true)
	}
	return err
}

func (b *batch) complete(ctx context.Context, o capture.Outcome) error {
	dead := append(o.Dead, b.bad...)
	br := &pgx.Batch{}
	if len(dead) > 0 {
		seqs := make([]int64, len(dead))
		for i, d := range dead {
			seqs[i] = int64(d.Event.Position)
		}
		br.Queue(b.s.sql.deadLetter, deadArgs(dead)...)
		br.Queue(b.s.sql.dropDead, seqs)
	}
	if len(o.Published) > 0 {
		seqs := make([]int64, len(o.Published))
		for i, ev := range o.Published {
			seqs[i] = int64(ev.Position)
		}
		br.Queue(b.s.sql.archive, seqs)
	}
	n := len(o.Published) + len(dead)
	if br.Len() > 0 {
		if err := b.tx.SendBatch(ctx, br).Close(); err != nil {
			return fmt.Errorf("archive %d rows: %w", n, err)
		}
	}
	if err := b.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit archive of %d rows: %w", n, err)
	}
	return nil
}

func deadArgs(dead []capture.DeadEvent) []any {
	n := len(dead)
	seqs, errs, classes := make([]int64, n), make([]string, n), make([]string, n)
	attempts, first, last := make([]int32, n), make([]time.Time, n), make([]time.Time, n)
	for i, d := range dead {
		seqs[i], errs[i], classes[i] = int64(d.Event.Position), d.Err, d.Class
		attempts[i] = int32(d.Attempts)
		first[i], last[i] = time.Unix(0, d.FirstFailed), time.Unix(0, d.LastFailed)
	}
	return []any{seqs, errs, classes, attempts, first, last}
}

// Abandon rolls the claim back; the rows are claimed again later.
func (b *batch) Abandon(ctx context.Context) {
	b.tx.Rollback(ctx)
	b.s.rewind.Store(true)
}

package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/schema"
)

// # Truncating the ring
//
// With archive mode partition published rows are not deleted: the outbox
// is a ring of list partitions (schema.Ring), and the leader truncates a
// partition once every row in it was published or dead-lettered. It
// cannot tell that row by row, since it settles batches without touching
// the outbox; it tells it from the slot. Every truncateEvery, the
// truncator:
//
//  1. takes a mark: H, the seq sequence's last value, then L, the virtual
//     transactions holding RowExclusiveLock on the outbox (other than its
//     own session). An insert takes that lock before it draws its seq, so
//     every transaction that drew a seq ≤ H is in L or had ended.
//  2. once none of L holds the lock any more, reads P, the server's WAL
//     position: every row with seq ≤ H was committed before P. The mark is
//     ready, F = H.
//  3. once the slot's confirmed position reached P, and then no drain is
//     pending for the slot (its rows committed before the slot are not in
//     its stream), every row with seq ≤ F was published or dead-lettered.
//     It truncates each partition, but the one the newest seq falls in,
//     whose greatest seq is at most F, re-checking that under an ACCESS
//     EXCLUSIVE lock it waits truncateLockTimeout for at most, and starts
//     a new mark. A lock it did not get keeps the mark for the next tick.
//
// A row that lands in a partition while the relay is behind (the ring
// wrapped) has a seq above F and keeps its partition until it too is
// published.

// truncateEvery is how often the truncator takes its next step.
const truncateEvery = time.Second

// truncateLockTimeout bounds the wait for a partition's lock, behind which
// the application's inserts and reads of the outbox would queue.
const truncateLockTimeout = "100ms"

// ringMark is the truncator's mark: seq is H and writers is L; lsn is P,
// 0 until the mark is ready.
type ringMark struct {
	seq     int64
	writers []string
	lsn     pglogrepl.LSN
}

// Truncations returns how many partitions of the ring outbox this source
// truncated (archive mode partition). It is safe for concurrent use.
func (s *Source) Truncations() int64 { return s.truncated.Load() }

// TruncateLockTimeouts returns how many truncations of a partition were
// put off because its lock was not granted within truncateLockTimeout.
// It is safe for concurrent use.
func (s *Source) TruncateLockTimeouts() int64 { return s.lockWaits.Load() }

// truncateRing runs the truncator until ctx ends: the stream's life, so
// that only the leader, while it streams, truncates.
func (s *Source) truncateRing(ctx context.Context) {
	fails := outage.New(s.log, "truncating the outbox's partitions failed; trying again every second",
		"truncating the outbox's partitions works again")
	t := time.NewTicker(truncateEvery)
	defer t.Stop()
	var m *ringMark
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next, err := s.ringStep(ctx, m)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			fails.Fail(err, "table", s.layout.Outbox.String())
		default:
			fails.OK()
			m = next
		}
	}
}

// ringStep takes the steps of the truncator that are due with mark m (nil:
// none taken yet) and returns the mark to go on with.
func (s *Source) ringStep(ctx context.Context, m *ringMark) (*ringMark, error) {
	var err error
	if m == nil {
		if m, err = s.takeMark(ctx); err != nil {
			return nil, err
		}
	}
	if m.lsn == 0 {
		if err := s.readyMark(ctx, m); err != nil || m.lsn == 0 {
			return m, err
		}
	}
	done, err := s.truncateUpTo(ctx, m)
	if err != nil || !done {
		return m, err
	}
	return nil, nil
}

// writersQuery lists the virtual transactions other than this session's
// that hold or wait for RowExclusiveLock on relation $1.
const writersQuery = `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
	WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'RowExclusiveLock' AND pid IS DISTINCT FROM pg_backend_pid()
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// takeMark reads H, then L.
func (s *Source) takeMark(ctx context.Context) (*ringMark, error) {
	m := &ringMark{}
	if err := s.opts.Pool.QueryRow(ctx, `SELECT coalesce(pg_sequence_last_value($1::regclass), 0)`, s.info.SeqSequence).Scan(&m.seq); err != nil {
		return nil, fmt.Errorf("read the outbox's seq sequence: %w", err)
	}
	if err := s.opts.Pool.QueryRow(ctx, writersQuery, s.layout.Outbox.Ident()).Scan(&m.writers); err != nil {
		return nil, fmt.Errorf("read the outbox's writers: %w", err)
	}
	return m, nil
}

// readyMark sets m's P once none of its writers holds the lock any more,
// reading the WAL position after looking at the locks.
func (s *Source) readyMark(ctx context.Context, m *ringMark) error {
	if len(m.writers) > 0 {
		var open bool
		err := s.opts.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'relation' AND relation = $1::regclass
			AND mode = 'RowExclusiveLock' AND virtualtransaction = ANY($2))`, s.layout.Outbox.Ident(), m.writers).Scan(&open)
		if err != nil || open {
			return err
		}
	}
	lsn, err := currentLSN(ctx, s.opts.Pool)
	if err != nil {
		return err
	}
	m.lsn = lsn
	return nil
}

// truncateUpTo truncates, once the slot confirmed m's P and no drain is
// pending, the partitions whose rows all have seqs up to m's F (see the
// steps above). It reports false while the slot is behind, a drain is
// pending or a partition's lock was not granted.
func (s *Source) truncateUpTo(ctx context.Context, m *ringMark) (bool, error) {
	var confirmed bool
	err := s.opts.Pool.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1), false)`,
		s.opts.Slot, m.lsn.String()).Scan(&confirmed)
	if err != nil || !confirmed {
		return false, err
	}
	// Read after the slot: a slot recreated meanwhile had its drain
	// recorded before it was created.
	var pending, newest int64
	err = s.opts.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %s WHERE slot = $1), coalesce(pg_sequence_last_value($2::regclass), 0)`,
		s.layout.DrainTable().Ident()), s.opts.Slot, s.info.SeqSequence).Scan(&pending, &newest)
	if err != nil || pending > 0 {
		return false, err
	}
	done := true
	current := int(newest / s.opts.PartitionRows % int64(len(s.partitions)))
	for k, p := range s.partitions {
		if k == current {
			continue
		}
		ok, err := s.truncatePartition(ctx, k, p, m.seq)
		if err != nil {
			return false, err
		}
		done = done && ok
	}
	return done, nil
}

// errKeep rolls back the truncation of a partition that holds a row with
// a seq above F.
var errKeep = errors.New("partition holds rows above the mark")

// truncatePartition truncates partition p, the ring's partition k, when
// its greatest seq is at most top, in one short transaction that waits
// truncateLockTimeout at most for the partition's ACCESS EXCLUSIVE lock and
// checks the greatest seq again under it. It reports false when the lock
// was not granted in time.
func (s *Source) truncatePartition(ctx context.Context, k int, p string, top int64) (bool, error) {
	var greatest *int64
	if err := s.opts.Pool.QueryRow(ctx, s.partitionQuery(k)).Scan(&greatest); err != nil {
		return false, fmt.Errorf("read the greatest seq of %s: %w", p, err)
	}
	if greatest == nil || *greatest > top {
		return true, nil
	}
	err := pgx.BeginFunc(ctx, s.opts.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+truncateLockTimeout+`'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+p+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, s.partitionQuery(k)).Scan(&greatest); err != nil {
			return err
		}
		if greatest != nil && *greatest > top {
			return errKeep
		}
		_, err := tx.Exec(ctx, `TRUNCATE `+p)
		return err
	})
	switch {
	case errors.Is(err, errKeep):
		return true, nil
	case pgerr.LockNotAvailable(err):
		s.lockWaits.Add(1)
		s.log.Debug("outbox partition busy; truncating it at the next tick", "partition", p, "lock_timeout", truncateLockTimeout)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("truncate %s: %w", p, err)
	}
	s.truncated.Add(1)
	s.log.Info("outbox partition truncated: every row in it was published or dead-lettered", "partition", p, "up_to_seq", top)
	return true, nil
}

// partitionQuery returns the query of the greatest seq of the ring's
// partition k, one read of the end of its seq index. It reads it through
// the outbox, whose partition key it names so that the planner reads
// partition k only: the relay's role holds SELECT on the outbox, and only
// TRUNCATE on its partitions.
func (s *Source) partitionQuery(k int) string {
	return fmt.Sprintf(`SELECT max(%[1]s) FROM %[2]s WHERE (%[1]s / %[3]d) %% %[4]d = %[5]d`,
		schema.Q(s.layout.Cols.Seq), s.layout.Outbox.Ident(), s.opts.PartitionRows, len(s.partitions), k)
}

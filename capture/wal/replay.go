package wal

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/relay/internal/schema"
)

// # Replayed events
//
// A stream starts at the slot's confirmed position, which lags behind what
// earlier runs (or an earlier stream of this run) handed to the pipeline:
// the slot is confirmed only past a prefix of archived batches, and a
// kill -9 loses the last status update. Every transaction committed before
// the stream started may therefore have been published and archived
// already. For a batch that begins at or below that position the source
// looks its rows up once, before handing it out, and drops the events
// whose row is no longer unarchived in the outbox: deleted, marked or
// moved per archive.mode by an earlier run, moved to the dead-letter
// table, or archived by a drain of the table. A row the application itself
// deleted before any relay published it is dropped too, as poll mode never
// sees it. Batches that begin after that position are live and are not
// looked up. An outbox lacking a relay column (schema.Info.Missing, a
// table made for Debezium) is not looked up at all: its application may
// delete each row in the transaction that inserts it, so a missing row
// does not tell that it was published, and replayed events are published
// again instead. Neither is the ring outbox of archive mode partition,
// which keeps published rows until it truncates their partition.

// currentLSN returns the server's current WAL insert position: every
// transaction an earlier stream could have received committed before it.
func currentLSN(ctx context.Context, q schema.Querier) (pglogrepl.LSN, error) {
	var s string
	if err := q.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		return 0, fmt.Errorf("read the current WAL position: %w", err)
	}
	return pglogrepl.ParseLSN(s)
}

// replayed reports whether b begins with a transaction that committed
// before the stream started.
func (st *stream) replayed(b *batch) bool {
	return len(b.events) > 0 && pglogrepl.LSN(b.events[0].Position) <= st.replayTo
}

// dropArchived removes from b, a replayed batch, the events whose rows are
// no longer unarchived in the outbox, and counts them. A row that is not
// visible may belong to a transaction whose commit is not visible yet (see
// waitVisible): the rows found missing are looked up again once the
// batch's transactions are visible. It returns whether events are left.
func (st *stream) dropArchived(ctx context.Context, b *batch) (bool, error) {
	ids := make([]string, len(b.events))
	for i, ev := range b.events {
		ids[i] = b.storedID(ev)
	}
	found, err := st.lookUp(ctx, ids)
	if err != nil {
		return false, err
	}
	if len(found) < len(ids) {
		if err := waitVisible(ctx, st.src.opts.Pool, b.xids); err != nil {
			return false, err
		}
		if found, err = st.lookUp(ctx, ids); err != nil {
			return false, err
		}
	}
	kept := 0
	for i, ev := range b.events {
		if found[ids[i]] {
			b.events[kept], b.seqs[kept] = ev, b.seqs[i]
			kept++
		}
	}
	st.src.skipped.Add(int64(len(b.events) - kept))
	clear(b.events[kept:])
	b.events, b.seqs = slices.Clip(b.events[:kept]), slices.Clip(b.seqs[:kept])
	return kept > 0 || len(b.bad) > 0, nil
}

// lookUp returns the ids, among ids, of rows still unarchived in the
// outbox.
func (st *stream) lookUp(ctx context.Context, ids []string) (map[string]bool, error) {
	rows, err := st.src.opts.Pool.Query(ctx, st.src.sql.unarchived, ids)
	if err != nil {
		return nil, fmt.Errorf("look up %d replayed rows: %w", len(ids), err)
	}
	defer rows.Close()
	found := make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("look up replayed rows: %w", err)
		}
		found[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up %d replayed rows: %w", len(ids), err)
	}
	return found, nil
}

// Replayed returns how many events the source's streams replayed from the
// slot (committed before the stream started) and dropped because an
// earlier run had archived them. The replayed events it hands out are not
// counted: a row still unarchived may have reached the broker in an earlier
// run or never (a backlog written while no relay ran), and the source
// cannot tell which. It is safe for concurrent use.
func (s *Source) Replayed() (skipped int64) { return s.skipped.Load() }

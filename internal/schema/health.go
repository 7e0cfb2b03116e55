package schema

import (
	"context"
	"fmt"
	"slices"
)

// Warning is a condition of the relay's tables that does not stop the
// relay but slows capture down or makes it work harder: what is wrong and
// the statements that fix it.
type Warning struct {
	What, Fix string
}

// Bloat thresholds: the outbox counts as bloated when its dead rows
// (pg_stat_user_tables.n_dead_tup) number at least bloatFloor and more than
// bloatRatio times its live rows.
const (
	bloatRatio = 10
	bloatFloor = 100000
)

// Warnings inspects the outbox table for what slows capture: with poll, no
// valid btree index whose first column is seq to serve the claim query (in
// archive mode mark a partial one on unpublished rows also serves), and
// dead rows far outnumbering live ones, which vacuum has not removed, and
// the btree index on the dead-letter table's aggregate id of earlier
// releases (see deadLetterIndexes). It only reads catalogs and statistics.
func (l Layout) Warnings(ctx context.Context, q Querier, poll bool, archiveMode string) ([]Warning, error) {
	var out []Warning
	if poll {
		ok, err := l.hasPollIndex(ctx, q, archiveMode == ArchiveMark)
		if err != nil {
			return nil, err
		}
		if !ok {
			fix := l.CreatePollIndex()
			if archiveMode == ArchiveMark {
				fix = l.unpublishedIndex().create(true)
			}
			out = append(out, Warning{
				What: fmt.Sprintf("outbox table %s has no index on %s: every poll scans the table, and capture slows down as it grows", l.Outbox, Q(l.Cols.Seq)),
				Fix:  fix + " (relay init creates it)",
			})
		}
	}
	legacy := l.dropLegacyAggregateIndex()
	var old bool
	if err := q.QueryRow(ctx, legacy.Probe).Scan(&old); err != nil {
		return nil, fmt.Errorf("inspect the indexes of %s: %w", l.DeadLetter, err)
	}
	if old {
		out = append(out, Warning{
			What: fmt.Sprintf("dead-letter table %s has the btree index on %s of earlier releases, which cannot hold a long aggregate id: "+
				"such a dead letter is kept with its values cut", l.DeadLetter, Q(l.Cols.AggregateID)),
			Fix: "run `relay init`, which builds the index on hashtext(aggregate_id) that replaces it and drops it, both CONCURRENTLY",
		})
	}
	w, err := l.bloat(ctx, q)
	if err != nil || w == nil {
		return out, err
	}
	return append(out, *w), nil
}

// hasPollIndex reports whether a valid btree index on the outbox leads with
// the seq column, without a predicate or, when unpublished is set, with the
// predicate of archive mode mark's partial index.
func (l Layout) hasPollIndex(ctx context.Context, q Querier, unpublished bool) (bool, error) {
	rows, err := q.Query(ctx, `SELECT coalesce(pg_get_expr(i.indpred, i.indrelid), '')
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		WHERE i.indrelid = $1::regclass AND i.indisvalid AND i.indisready AND a.amname = 'btree'
		AND i.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped)`,
		l.Outbox.Ident(), l.Cols.Seq)
	if err != nil {
		return false, fmt.Errorf("inspect the indexes of %s: %w", l.Outbox, err)
	}
	var preds []string
	var pred string
	for rows.Next() {
		if err := rows.Scan(&pred); err != nil {
			rows.Close()
			return false, err
		}
		preds = append(preds, pred)
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("inspect the indexes of %s: %w", l.Outbox, err)
	}
	mark := fmt.Sprintf("(%s IS NULL)", Q(PublishedAt))
	return slices.ContainsFunc(preds, func(p string) bool { return p == "" || unpublished && p == mark }), nil
}

// bloat returns a warning when the outbox's dead rows exceed the bloat
// thresholds, nil otherwise.
func (l Layout) bloat(ctx context.Context, q Querier) (*Warning, error) {
	var live, dead int64
	var autovacuum bool
	err := q.QueryRow(ctx, `SELECT s.n_live_tup, s.n_dead_tup,
		coalesce((SELECT option_value::bool FROM pg_options_to_table(c.reloptions) WHERE option_name = 'autovacuum_enabled'), true)
		AND current_setting('autovacuum')::bool
		FROM pg_stat_all_tables s JOIN pg_class c ON c.oid = s.relid WHERE s.relid = $1::regclass`,
		l.Outbox.Ident()).Scan(&live, &dead, &autovacuum)
	if err != nil {
		return nil, fmt.Errorf("read the statistics of %s: %w", l.Outbox, err)
	}
	if dead < bloatFloor || dead <= bloatRatio*live {
		return nil, nil
	}
	t := l.Outbox.Ident()
	fix := fmt.Sprintf("VACUUM (ANALYZE) %s; and let autovacuum keep up with it: ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 1)", t, t)
	if !autovacuum {
		fix = fmt.Sprintf("VACUUM (ANALYZE) %s; autovacuum is off for it: ALTER TABLE %s RESET (autovacuum_enabled) (and autovacuum = on in postgresql.conf)", t, t)
	}
	return &Warning{
		What: fmt.Sprintf("outbox table %s is bloated: %d dead rows, %d live; polls and index scans wade through the dead ones", l.Outbox, dead, live),
		Fix:  fix + "; if dead rows remain after VACUUM, a long transaction or a replication slot holds vacuum back (pg_stat_activity.backend_xmin, pg_replication_slots.xmin)",
	}, nil
}

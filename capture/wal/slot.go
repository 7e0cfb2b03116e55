package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
)

// SQLSTATEs the source acts on.
const (
	codeDuplicateObject = "42710"
	codeUndefinedObject = "42704"
	codeObjectInUse     = "55006"
	codeInsufficientPrv = "42501"
)

func hasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// permanentIfDenied marks a missing privilege or a refused login
// (SQLSTATE class 28) as an error that retrying does not fix.
func permanentIfDenied(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == codeInsufficientPrv || strings.HasPrefix(pgErr.Code, "28")) {
		return fault.AsPermanent(err)
	}
	return err
}

// slotInfo is what pg_replication_slots says about the slot.
type slotInfo struct {
	exists    bool
	lost      bool // invalidated: the WAL it needs is gone
	failover  bool // synchronized to standbys (PostgreSQL 17+)
	confirmed pglogrepl.LSN
}

// inspectSlot reads the slot's state. A slot of the name that is not a
// pgoutput slot of this database is a permanent error.
func inspectSlot(ctx context.Context, q schema.Querier, slot string) (slotInfo, error) {
	var ours, lost, failover bool
	var confirmed *string
	err := q.QueryRow(ctx, `SELECT slot_type = 'logical' AND plugin = 'pgoutput' AND database = current_database(),
		  coalesce(wal_status = 'lost', false) OR coalesce((to_jsonb(s)->>'conflicting')::bool, false)
		    OR to_jsonb(s)->>'invalidation_reason' IS NOT NULL,
		  confirmed_flush_lsn::text, coalesce((to_jsonb(s)->>'failover')::bool, false)
		FROM pg_replication_slots s WHERE slot_name = $1`, slot).Scan(&ours, &lost, &confirmed, &failover)
	if errors.Is(err, pgx.ErrNoRows) {
		return slotInfo{}, nil
	}
	if err != nil {
		return slotInfo{}, fmt.Errorf("inspect replication slot %s: %w", slot, err)
	}
	if !ours {
		return slotInfo{}, fault.AsPermanent(fmt.Errorf("replication slot %s exists but is not a pgoutput slot of this database; set capture.wal.slot to another name", slot))
	}
	info := slotInfo{exists: true, lost: lost, failover: failover}
	if confirmed != nil {
		if info.confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return slotInfo{}, fmt.Errorf("replication slot %s: %w", slot, err)
		}
	}
	return info, nil
}

// createSlot creates the slot, with failover enabled when asked, with a
// pending drain of the rows committed before it (see
// schema.Layout.CreateSlot). A slot created concurrently by another process
// is fine: its drain is recorded too.
func createSlot(ctx context.Context, q schema.Querier, l schema.Layout, slot string, failover bool) error {
	c := l.CreateSlot(slot, failover)
	for _, stmt := range c.List() {
		_, err := q.Exec(ctx, stmt)
		if stmt == c.Create && hasCode(err, codeDuplicateObject) {
			err = nil
		}
		if err != nil {
			return permanentIfDenied(fmt.Errorf("create replication slot %s: %w", slot, err))
		}
	}
	return nil
}

// dropSlot drops a lost slot; it fails while a connection still uses it.
func dropSlot(ctx context.Context, q schema.Querier, slot string) error {
	_, err := q.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	if err != nil && !hasCode(err, codeUndefinedObject) {
		return permanentIfDenied(fmt.Errorf("drop lost replication slot %s: %w", slot, err))
	}
	return nil
}

// pendingDrain returns the bound of the slot's pending drain, reading it
// first when it was not set yet; ok is false when no drain is pending.
func pendingDrain(ctx context.Context, q schema.Querier, l schema.Layout, slot string) (to int64, ok bool, err error) {
	var bound *int64
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT drain_to FROM %s WHERE slot = $1`, l.DrainTable().Ident()), slot).Scan(&bound)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err == nil && bound == nil {
		err = q.QueryRow(ctx, l.FillDrain(slot)).Scan(&to)
		bound = &to
	}
	if err != nil {
		return 0, false, fmt.Errorf("read pending drain of slot %s: %w", slot, err)
	}
	return *bound, true, nil
}

// finishDrain removes the slot's pending drain with bound to.
func finishDrain(ctx context.Context, q schema.Querier, l schema.Layout, slot string, to int64) error {
	_, err := q.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE slot = $1 AND drain_to = $2`, l.DrainTable().Ident()), slot, to)
	if err != nil {
		return fmt.Errorf("finish drain of slot %s: %w", slot, err)
	}
	return nil
}

// ensurePublication creates the publication when it is missing and checks
// that it publishes every insert into the outbox with every mapped column,
// and for a partitioned outbox under the outbox's name
// (publish_via_partition_root). A publication that does not is a permanent
// error naming both.
func ensurePublication(ctx context.Context, q schema.Querier, l schema.Layout, pub string) error {
	err := checkPublication(ctx, q, l, pub)
	if !errors.Is(err, errNoPublication) {
		return err
	}
	viaRoot, err := partitioned(ctx, q, l)
	if err != nil {
		return err
	}
	if _, err := q.Exec(ctx, l.CreatePublication(pub, viaRoot)); err != nil && !hasCode(err, codeDuplicateObject) {
		return permanentIfDenied(fmt.Errorf("publication %s does not exist and creating it failed (run `relay init` as the owner of %s): %w", pub, l.Outbox, err))
	}
	return checkPublication(ctx, q, l, pub)
}

var errNoPublication = errors.New("publication does not exist")

// partitioned reports whether the outbox is a partitioned table.
func partitioned(ctx context.Context, q schema.Querier, l schema.Layout) (bool, error) {
	var p bool
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, l.Outbox.Ident()).Scan(&p)
	if err != nil {
		return false, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	return p, nil
}

// checkPublication returns errNoPublication when pub is missing, and a
// permanent error when it does not cover the outbox's inserts, or those
// of a partitioned outbox under its partitions' names.
func checkPublication(ctx context.Context, q schema.Querier, l schema.Layout, pub string) error {
	var inserts, viaRoot bool
	err := q.QueryRow(ctx, `SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1`, pub).Scan(&inserts, &viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s", errNoPublication, pub)
	}
	if err != nil {
		return fmt.Errorf("inspect publication %s: %w", pub, err)
	}
	if p, err := partitioned(ctx, q, l); err != nil {
		return err
	} else if p && !viaRoot {
		return fault.AsPermanent(fmt.Errorf("publication %s publishes the inserts into partitioned outbox table %s under its partitions' names: "+
			"run ALTER PUBLICATION %s SET (publish_via_partition_root = true), or set capture.wal.publication to a new name", pub, l.Outbox, schema.Q(pub)))
	}
	var table []byte
	err = q.QueryRow(ctx, `SELECT to_jsonb(t) || jsonb_build_object('columns', (SELECT jsonb_agg(attname) FROM pg_attribute
		  WHERE attrelid = format('%I.%I', $2::text, $3::text)::regclass AND attnum > 0 AND NOT attisdropped)) FROM pg_publication_tables t
		WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`, pub, l.Outbox.Schema, l.Outbox.Name).Scan(&table)
	if errors.Is(err, pgx.ErrNoRows) {
		return fault.AsPermanent(fmt.Errorf("publication %s exists but does not cover outbox table %s: run ALTER PUBLICATION %s ADD TABLE %s, or set capture.wal.publication to a new name",
			pub, l.Outbox, schema.Q(pub), l.Outbox.Ident()))
	}
	if err != nil {
		return fmt.Errorf("inspect publication %s: %w", pub, err)
	}
	if !inserts {
		return fault.AsPermanent(fmt.Errorf("publication %s does not publish inserts into outbox table %s; set capture.wal.publication to a new name", pub, l.Outbox))
	}
	return checkPublishedColumns(table, l, pub)
}

// checkPublishedColumns rejects a row filter or a column list that hides
// outbox rows or mapped columns (PostgreSQL 15 and later); a mapped column
// the table lacks (see schema.Info.Missing) is not looked for.
func checkPublishedColumns(table []byte, l schema.Layout, pub string) error {
	var t struct {
		RowFilter *string  `json:"rowfilter"`
		AttNames  []string `json:"attnames"`
		Columns   []string `json:"columns"` // the table's
	}
	if err := json.Unmarshal(table, &t); err != nil {
		return fmt.Errorf("inspect publication %s: %w", pub, err)
	}
	if t.RowFilter != nil {
		return fault.AsPermanent(fmt.Errorf("publication %s filters the rows of outbox table %s (WHERE %s); events would be lost: set capture.wal.publication to a new name",
			pub, l.Outbox, *t.RowFilter))
	}
	for _, c := range l.Cols.List() {
		if t.AttNames != nil && !slices.Contains(t.AttNames, c) && slices.Contains(t.Columns, c) {
			return fault.AsPermanent(fmt.Errorf("publication %s does not publish column %s of outbox table %s; set capture.wal.publication to a new name",
				pub, c, l.Outbox))
		}
	}
	return nil
}

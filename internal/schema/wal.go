package schema

import (
	"context"
	"fmt"
)

// DrainTable is where wal capture records, per replication slot, that the
// outbox rows committed before the slot existed must be published through
// the poll path before streaming from it (see capture/wal). It sits next to
// the outbox: <outbox>_relay_drain.
func (l Layout) DrainTable() Table {
	return Table{Schema: l.Outbox.Schema, Name: derived(l.Outbox.Name, "_relay_drain")}
}

// CreateDrainTable returns the statement creating the drain table when it
// is missing. A row means: before streaming from slot, drain the outbox
// rows with seq ≤ drain_to (NULL: not read yet).
func (l Layout) CreateDrainTable() string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  slot text PRIMARY KEY,
  drain_to bigint,
  since timestamptz NOT NULL DEFAULT now()
)`, l.DrainTable().Ident())
}

// DrainTableStep returns the init step creating the drain table.
func (l Layout) DrainTableStep() Step {
	return tableStep("drain table", l.DrainTable(), l.CreateDrainTable())
}

// EnsureDrainTable creates the drain table when it is missing; it issues no
// DDL when the table exists, and a role that may not create it gets a
// permanent error naming it and `relay init`.
func EnsureDrainTable(ctx context.Context, q Querier, l Layout) error {
	return ensureTable(ctx, q, "drain table", l.DrainTable(), []string{l.CreateDrainTable()})
}

// CreatePublication returns the statement creating publication pub for
// the inserts into the outbox table; with viaRoot (a partitioned outbox)
// they are published as the outbox's, not its partitions' (PostgreSQL 13
// and later).
func (l Layout) CreatePublication(pub string, viaRoot bool) string {
	with := "publish = 'insert'"
	if viaRoot {
		with += ", publish_via_partition_root = true"
	}
	return fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (%s)`, Q(pub), l.Outbox.Ident(), with)
}

// SlotCreation is what creates a logical replication slot with a pending
// drain of the rows committed before it. Its statements run in the order of
// List: RecordDrain first, so that a crash between the steps never leaves a
// slot whose older rows nobody drains.
type SlotCreation struct {
	// RecordDrain records a pending drain of the slot, without a bound.
	RecordDrain string
	// Create creates the slot (plugin pgoutput).
	Create string
	// FillDrain sets the drain's bound to the seq sequence's last value.
	FillDrain string
}

// List returns the statements in the order they run.
func (c SlotCreation) List() []string { return []string{c.RecordDrain, c.Create, c.FillDrain} }

// CreateSlot returns what creates logical replication slot slot, with
// failover enabled when failover is set (PostgreSQL 17 and later).
func (l Layout) CreateSlot(slot string, failover bool) SlotCreation {
	create := fmt.Sprintf(`SELECT pg_create_logical_replication_slot(%s, 'pgoutput')`, Literal(slot))
	if failover {
		create = fmt.Sprintf(`SELECT pg_create_logical_replication_slot(%s, 'pgoutput', failover => true)`, Literal(slot))
	}
	return SlotCreation{
		RecordDrain: fmt.Sprintf(`INSERT INTO %s (slot) VALUES (%s) ON CONFLICT (slot) DO UPDATE SET drain_to = NULL, since = now()`,
			l.DrainTable().Ident(), Literal(slot)),
		Create:    create,
		FillDrain: l.FillDrain(slot),
	}
}

// FillDrain returns the statement that sets the bound of slot's pending
// drain, when not set yet, to the last value of the seq column's sequence,
// returning it. An outbox without a seq column (see InspectFor) gets 1 when
// it holds rows, else 0: its drain takes every row it holds when it starts.
func (l Layout) FillDrain(slot string) string {
	return fmt.Sprintf(`UPDATE %s SET drain_to = CASE
    WHEN EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s AND attnum > 0 AND NOT attisdropped)
    THEN coalesce(pg_sequence_last_value(pg_get_serial_sequence(%[2]s, %[3]s)::regclass), 0)
    ELSE (SELECT count(*) FROM (SELECT FROM %[5]s LIMIT 1) o) END
  WHERE slot = %[4]s AND drain_to IS NULL RETURNING drain_to`,
		l.DrainTable().Ident(), Literal(l.Outbox.Ident()), Literal(l.Cols.Seq), Literal(slot), l.Outbox.Ident())
}

// LeaveDrain returns the statement recording that outbox rows up to seq $1
// were left in the outbox behind slot's confirmed position (held for a
// broken destination): slot's pending drain covers at least them. A
// pending drain without a bound yet keeps none, since it drains every row
// there is when it starts.
func (l Layout) LeaveDrain(slot string) string {
	return fmt.Sprintf(`INSERT INTO %[1]s AS d (slot, drain_to) VALUES (%[2]s, $1) ON CONFLICT (slot) DO UPDATE
  SET drain_to = CASE WHEN d.drain_to IS NULL THEN NULL ELSE greatest(d.drain_to, excluded.drain_to) END`,
		l.DrainTable().Ident(), Literal(slot))
}

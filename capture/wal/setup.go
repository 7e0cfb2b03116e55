package wal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/schema"
)

// SetupSQL returns the statements Setup runs, for `relay init --dry-run`:
// the drain table, the publication (only when missing; with viaRoot for a
// partitioned outbox) and the slot with its pending drain (only when the
// slot is missing).
func SetupSQL(tl table.Layout, slot, publication string, failover, viaRoot bool) []string {
	l := schema.Layout(tl)
	stmts := []string{
		l.DrainTableStep().SQL(),
		"-- publication " + publication + ", when missing:\n" + l.CreatePublication(publication, viaRoot),
	}
	c := l.CreateSlot(slot, failover)
	c.RecordDrain = "-- replication slot " + slot + ", when missing:\n" + c.RecordDrain
	return append(stmts, c.List()...)
}

// Setup creates what wal capture needs besides the outbox and dead-letter
// tables when it is missing: the drain table, the publication and the
// replication slot, with a pending drain so that the first `relay run`
// publishes the rows written before the slot; with failover the slot is
// created with failover enabled (PostgreSQL 17 and later, else a permanent
// error). `relay init` calls it;
// `relay run` does the same by itself. A publication that exists without
// covering the outbox table is a permanent error naming both. Setup is
// idempotent and issues no DDL for what exists.
func Setup(ctx context.Context, q table.Querier, tl table.Layout, slot, publication string, failover bool) error {
	l := schema.Layout(tl)
	if !slotName.MatchString(slot) {
		return fmt.Errorf("replication slot name %q must match %s", slot, slotName)
	}
	if err := checkServer(ctx, q); err != nil {
		return err
	}
	if err := checkFailover(ctx, q, failover); err != nil {
		return err
	}
	if err := schema.EnsureDrainTable(ctx, q, l); err != nil {
		return err
	}
	if err := ensurePublication(ctx, q, l, publication); err != nil {
		return err
	}
	info, err := inspectSlot(ctx, q, slot)
	if err != nil || info.exists {
		return err
	}
	return createSlot(ctx, q, l, slot, failover)
}

// Finding is the outcome of one check of Check: Err is nil when it passed,
// and Fix says how to repair it otherwise.
type Finding struct {
	What string
	Err  error
	Fix  string
}

// Check reports what wal capture needs from the database, for `relay
// check`: wal_level, the replication privilege, a replication connection,
// the publication and the slot (with its lag). It changes nothing. The
// replication privilege is the REPLICATION attribute, superuser, or
// membership in rds_replication where that role exists (Amazon RDS and
// Aurora).
func Check(ctx context.Context, pool *pgxpool.Pool, tl table.Layout, slot, publication string, failover bool) []Finding {
	l := schema.Layout(tl)
	level, role, canReplicate, err := readServer(ctx, pool)
	if err == nil {
		err = checkWALLevel(level)
	}
	out := []Finding{{What: "wal_level = logical", Err: err,
		Fix: "ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL"}}
	if err == nil {
		err = checkReplication(role, canReplicate)
	}
	out = append(out, Finding{What: "replication privilege", Err: err, Fix: replicationFix(role)})
	out = append(out, Finding{What: "replication connection", Err: checkReplConn(ctx, pool),
		Fix: "allow the relay's user to connect to this database in pg_hba.conf, and raise max_wal_senders if all are busy"})
	err = checkPublication(ctx, pool, l, publication)
	fix := "ALTER PUBLICATION " + schema.Q(publication) + " ADD TABLE " + l.Outbox.Ident() + ", or set capture.wal.publication to a new name"
	if errors.Is(err, errNoPublication) {
		fix = "run `relay init` (or `relay run` as a role that may create it)"
	}
	out = append(out, Finding{What: "publication " + publication, Err: err, Fix: fix})
	if failover {
		out = append(out, Finding{What: "capture.wal.failover: PostgreSQL 17 or later", Err: checkFailover(ctx, pool, true),
			Fix: "set capture.wal.failover to false, or upgrade PostgreSQL"})
	}
	return append(out, checkSlot(ctx, pool, l, slot))
}

// replicationFix says how to give role the replication privilege.
func replicationFix(role string) string {
	return "ALTER ROLE " + schema.Q(role) + " REPLICATION (Amazon RDS/Aurora: GRANT rds_replication TO " + schema.Q(role) +
		"; see docs/operations.md for managed services)"
}

func checkReplConn(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pgconn.ConnectConfig(ctx, replConfig(Options{Pool: pool}))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = pglogrepl.IdentifySystem(ctx, conn)
	return err
}

func checkSlot(ctx context.Context, pool *pgxpool.Pool, l schema.Layout, slot string) Finding {
	f := Finding{What: "replication slot " + slot, Fix: "run `relay init` (or `relay run`, which creates it)"}
	info, err := inspectSlot(ctx, pool, slot)
	switch {
	case err != nil:
		f.Err, f.Fix = err, "set capture.wal.slot to another name"
	case !info.exists:
		f.Err = errors.New("missing")
	case info.lost:
		f.Err = errors.New("lost: the WAL it needs was removed (max_slot_wal_keep_size)")
		f.Fix = "`relay run` recreates it and publishes the outbox backlog first; consider raising max_slot_wal_keep_size"
	default:
		if st, _, _, err := newGuard(l, "", true, false).read(ctx, pool, slot); err == nil {
			f.What += fmt.Sprintf(" (wal_status %s, %d bytes behind, %d bytes of WAL retained)", st.WALStatus, st.LagBytes, st.RetainedBytes)
		}
	}
	return f
}

// Warnings reports, for `relay check`, settings that put the database at
// risk without stopping wal capture: an unlimited max_slot_wal_keep_size.
func Warnings(ctx context.Context, q table.Querier) []Finding {
	var keep string
	if err := q.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&keep); err != nil || keep != "-1" {
		return nil
	}
	return []Finding{{What: "max_slot_wal_keep_size",
		Err: errors.New("-1 (unlimited): while the relay does not stream (stopped, or stalled), its slot keeps every WAL segment, until the database's disk is full and PostgreSQL stops"),
		Fix: "bound it (size it to hold a few hours of WAL; a slot that passes it is lost and the relay then republishes the outbox from the table): " +
			"ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf();"}}
}

package wal

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
)

// failoverMinVersion is the first server_version_num with failover slots.
const failoverMinVersion = 170000

// checkFailover fails permanently when failover slots are asked for and the
// server is older than PostgreSQL 17.
func checkFailover(ctx context.Context, q schema.Querier, failover bool) error {
	if !failover {
		return nil
	}
	var num int
	var version string
	err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version)
	if err != nil {
		return fmt.Errorf("read the server's version: %w", err)
	}
	if num < failoverMinVersion {
		return fault.AsPermanent(fmt.Errorf("capture.wal.failover: true needs PostgreSQL 17 or later, and this server is %s: set capture.wal.failover to false, or upgrade", version))
	}
	return nil
}

// enableFailover enables failover on the existing slot with
// ALTER_REPLICATION_SLOT on a replication connection; when that fails (the
// slot is in use, or the role may not) it logs a warning and streaming goes
// on without failover.
func (s *Source) enableFailover(ctx context.Context) {
	err := alterFailover(ctx, s.repl, s.opts.Slot)
	if err != nil {
		s.log.Warn("capture.wal.failover is true but the existing replication slot has failover disabled and enabling it failed: "+
			"a promoted standby will not have the slot (the relay recreates it and publishes the outbox from the table first)",
			"slot", s.opts.Slot, "err", err)
		return
	}
	s.log.Info("failover enabled on the existing replication slot", "slot", s.opts.Slot)
}

// alterFailover runs ALTER_REPLICATION_SLOT slot (FAILOVER true).
func alterFailover(ctx context.Context, repl *pgconn.Config, slot string) error {
	conn, err := pgconn.ConnectConfig(ctx, repl)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, fmt.Sprintf(`ALTER_REPLICATION_SLOT %s ( FAILOVER true )`, schema.Q(slot))).ReadAll()
	return err
}

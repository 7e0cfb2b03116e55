package app

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

// runPrivileges returns the privileges `relay run` needs with cfg
// (schema.RunPrivileges), the one list that run's start check, `relay
// check` and `relay init --role` use; info describes the outbox (its seq
// column's sequence, or none for the name PostgreSQL gives a new identity
// column's).
func runPrivileges(cfg *config.Config, info schema.Info) []schema.Privilege {
	l := layoutOf(cfg)
	var partitions []string
	if r, ok := ringOf(cfg); ok {
		partitions = l.RingPartitions(r, info)
	}
	return l.RunPrivileges(schema.RunNeeds{WAL: cfg.Capture.Mode == "wal", ArchiveMode: cfg.Archive.Mode,
		Prune: cfg.Archive.Retention > 0, Sequence: info.SeqSequence, NoSeq: info.Lacks(l.Cols.Seq),
		Partitions: partitions, Messages: cfg.Capture.WAL.Messages()})
}

// ringOf returns the ring outbox of archive.mode partition; ok is false
// with another mode.
func ringOf(cfg *config.Config) (r schema.Ring, ok bool) {
	if cfg.Archive.Mode != schema.ArchivePartition {
		return r, false
	}
	return schema.Ring{Partitions: cfg.Archive.Partitions, Rows: int64(cfg.Archive.PartitionRows)}, true
}

// inspectRing checks, with archive.mode partition, that the outbox is the
// ring of cfg and sets info.Partitions (schema.Layout.RingInfo); it does
// nothing with another mode.
func inspectRing(ctx context.Context, q schema.Querier, cfg *config.Config, info *schema.Info) error {
	r, ok := ringOf(cfg)
	if !ok {
		return nil
	}
	return layoutOf(cfg).RingInfo(ctx, q, r, info)
}

// checkGrants returns an error naming every privilege of runPrivileges the
// current role lacks, the path that needs each and the statements that
// grant them, so that `relay run` refuses to start without one instead of
// failing on it when that path first runs (wal mode's table drain after a
// lost slot, say); the error also names the objects that do not exist.
// Missing objects alone are left to the capture source, which creates them
// (the role then owns them) or names them and `relay init`; so is an
// outbox that schema.Inspect rejects. A database that cannot be reached
// returns its error, which openWhenReachable waits out.
func checkGrants(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) error {
	info, err := schema.InspectFor(ctx, pool, layoutOf(cfg), cfg.Capture.Mode == "wal")
	if err != nil && !cfg.Capture.WAL.Messages() { // the table-free outbox has no table to inspect
		if unreachable(err) {
			return err
		}
		return nil
	}
	if err := inspectRing(ctx, pool, cfg, &info); err != nil {
		return nil // the source reports an outbox that is not the ring
	}
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		return fmt.Errorf("read the current role: %w", err)
	}
	missing, absent, err := schema.MissingPrivileges(ctx, pool, runPrivileges(cfg, info))
	if err != nil || len(missing) == 0 {
		return err
	}
	lines := grantFix(missing, role)
	for _, obj := range absent {
		lines = append(lines, obj+" does not exist: run `relay init` as its owner")
	}
	return fmt.Errorf("role %s lacks privileges `relay run` needs; it refuses to start without them:\n  %s",
		schema.Q(role), strings.Join(lines, "\n  "))
}

// grantFix returns the lines listing the missing privileges, each with the
// path that needs it, and the statements that grant them to role.
func grantFix(missing []schema.Privilege, role string) []string {
	var lines []string
	for _, p := range missing {
		lines = append(lines, fmt.Sprintf("missing %s: %s", p, p.Why))
	}
	owner := "as the owner of these objects, run:"
	if slices.ContainsFunc(missing, func(p schema.Privilege) bool { return p.Kind == "ROLE" }) {
		owner = "as the owner of these objects (a superuser for ALTER ROLE), run:"
	}
	lines = append(lines, owner)
	for _, stmt := range schema.GrantSQL(missing, role) {
		lines = append(lines, "  "+stmt+";")
	}
	return lines
}

// grantSQL returns the statements giving role what `relay run` needs with
// cfg, for `relay init --role`: the GRANTs and, in wal mode, the
// replication privilege, with its managed-service alternative.
func grantSQL(cfg *config.Config, info schema.Info, role string) []string {
	stmts := schema.GrantSQL(runPrivileges(cfg, info), role)
	for i, stmt := range stmts {
		if strings.HasPrefix(stmt, "ALTER ROLE ") {
			stmts[i] = "-- replication (Amazon RDS/Aurora: GRANT rds_replication TO " + schema.Q(role) +
				" instead; see docs/operations.md)\n" + stmt
		}
	}
	return stmts
}

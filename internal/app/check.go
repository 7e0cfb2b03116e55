package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

// ErrCheckFailed is returned by Check when any check failed.
var ErrCheckFailed = errors.New("check failed")

// Check validates what the relay needs beyond the config file: Postgres is
// reachable, the outbox table exists with the mapped columns, the role has
// the privileges `relay run` needs (missing ones are printed as the GRANT
// statements to run), and the sink
// is reachable with its stream in place. It prints one line per check with
// the fix for each problem and returns ErrCheckFailed when any failed. log
// receives the sink's logs.
func Check(ctx context.Context, cfg *config.Config, w io.Writer, log *slog.Logger) error {
	conns, err := budget(cfg)
	if err != nil {
		return err
	}
	failed := false
	report := func(what string, err error, fix string) {
		if err == nil {
			fmt.Fprintf(w, "ok    %s\n", what)
			return
		}
		failed = true
		fmt.Fprintf(w, "FAIL  %s: %v\n      fix: %s\n", what, err, fix)
	}
	l := layoutOf(cfg)
	pool, err := connect(ctx, cfg.Postgres, 2)
	fix := "check postgres.url, that the server runs and accepts this user and password"
	if IsUsage(err) {
		fix = "fix postgres.url as the message says"
	}
	report("postgres "+describeDB(cfg.Postgres), err, fix)
	if err == nil {
		report("postgres session: one server session per connection", sessionPinned(ctx, pool.Config()), poolerFix)
		report("postgres connections: relay run opens "+conns.String(), serverRoom(ctx, pool, conns.total),
			"lower postgres.max_conns, or raise the server's max_connections")
		if cfg.Capture.WAL.Messages() {
			checkMessages(ctx, pool, cfg, w, report)
		} else {
			info, err := schema.InspectFor(ctx, pool, l, cfg.Capture.Mode == "wal")
			if err == nil {
				err = inspectRing(ctx, pool, cfg, &info)
			}
			report("outbox table "+l.Outbox.String(), err, "run `relay init`, or fix outbox.table / outbox.columns / outbox.order_by / archive.partitions / archive.partition_rows")
			if err == nil {
				checkPrivileges(ctx, pool, cfg, info, report)
				warnOutbox(ctx, pool, cfg, w)
			}
		}
		if cfg.Capture.Mode == "wal" && !cfg.Capture.WAL.Messages() {
			for _, f := range wal.Check(ctx, pool, table.Layout(l), cfg.Capture.WAL.Slot, cfg.Capture.WAL.Publication, cfg.Capture.WAL.Failover) {
				report(f.What, f.Err, f.Fix)
			}
			warnWAL(ctx, pool, w)
		}
		if cfg.Archive.Mode == schema.ArchivePartition && cfg.Sink.HeldMaxAge == 0 {
			warnHeldInMemory(w, "archive.mode partition")
		}
		pool.Close()
	}
	snk, err := openSink(ctx, cfg, log, pipelineWindow)
	report("sink "+cfg.Sink.Type, err, "check the sink.* settings")
	if err == nil {
		report(snk.name, snk.check(ctx), "see the message above")
		snk.Close()
	}
	if failed {
		return ErrCheckFailed
	}
	return nil
}

// checkMessages reports what the table-free outbox (capture.wal.source
// messages) needs: the privileges, the server (wal_level, replication,
// PostgreSQL 14 or later), the publication and the slot; and it warns
// that messages committed while the slot is missing are lost.
func checkMessages(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, w io.Writer, report func(what string, err error, fix string)) {
	checkPrivileges(ctx, pool, cfg, schema.Info{}, report)
	l := table.Layout(layoutOf(cfg))
	wc := cfg.Capture.WAL
	for _, f := range wal.CheckMessages(ctx, pool, l, wc.Slot, wc.Publication, wc.Failover) {
		report(f.What, f.Err, f.Fix)
	}
	for _, f := range append(wal.Warnings(ctx, pool), wal.MessageWarnings(ctx, pool, wc.Slot)...) {
		fmt.Fprintf(w, "WARN  %s: %v\n      fix: %s\n", f.What, f.Err, f.Fix)
	}
	if cfg.Sink.HeldMaxAge == 0 {
		warnHeldInMemory(w, "capture.wal.source messages")
	}
}

// warnHeldInMemory warns that with setting (which leaves no table to hold a
// broken destination's events in) and sink.held_max_age 0 the slot waits
// for a broken destination as long as it stays broken.
func warnHeldInMemory(w io.Writer, setting string) {
	fmt.Fprintf(w, "WARN  sink.held_max_age: 0 with %s: %s\n      fix: %s\n", setting,
		"a broken destination holds its events in memory and the slot with them, for as long as it stays broken (no table to leave them in); once the window is full every destination waits",
		"set sink.held_max_age (e.g. 15m) so that its events are dead-lettered and the slot moves on")
}

// serverRoom fails when the server's max_connections, less the slots
// reserved for superusers, is below n.
func serverRoom(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var room int
	err := pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int`).Scan(&room)
	if err != nil {
		return fmt.Errorf("read max_connections: %w", err)
	}
	if room < n {
		return fmt.Errorf("the server accepts only %d connections for non-superusers", room)
	}
	return nil
}

// checkPrivileges reports the objects `relay run` uses that are missing and
// the privileges the current role lacks on those that exist, as GRANTs. The
// replication privilege is left to wal.Check, which also names the
// managed services' equivalent.
func checkPrivileges(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, info schema.Info,
	report func(what string, err error, fix string)) {
	var role string
	err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role)
	var missing []schema.Privilege
	var absent []string
	if err == nil {
		needs := slices.DeleteFunc(runPrivileges(cfg, info), func(p schema.Privilege) bool { return p.Kind == "ROLE" })
		missing, absent, err = schema.MissingPrivileges(ctx, pool, needs)
	}
	fix := []string{"see the error"}
	if err == nil && len(missing) > 0 {
		err = fmt.Errorf("role %s lacks %d privileges relay run needs", role, len(missing))
		fix = grantFix(missing, role)
	}
	report("privileges of role "+role, err, strings.Join(fix, "\n        "))
	for _, obj := range absent {
		report(obj, errors.New("missing"), "run `relay init`")
	}
}

// warnWAL prints wal capture's warnings (wal.Warnings): risks that do not
// stop the relay, so they do not fail the check.
func warnWAL(ctx context.Context, pool *pgxpool.Pool, w io.Writer) {
	for _, f := range wal.Warnings(ctx, pool) {
		fmt.Fprintf(w, "WARN  %s: %v\n      fix: %s\n", f.What, f.Err, f.Fix)
	}
}

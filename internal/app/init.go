package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/progress"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/schema"
)

// InitOptions vary Init. The zero value creates what is missing with the
// default lock timeout.
type InitOptions struct {
	// DryRun prints the SQL instead of running it.
	DryRun bool
	// Role, when set, is the role `relay run` connects as: Init prints
	// (DryRun) or grants the privileges it needs and nothing more.
	Role string
	// LockTimeout bounds each wait for a table lock, so that init never
	// queues the application's writes behind it for longer. Default
	// DefaultLockTimeout.
	LockTimeout time.Duration
	// Progress, when set, receives the progress of index builds (phase,
	// blocks or tuples done of total, rate, ETA, the transactions a build
	// waits for) from pg_stat_progress_create_index, sampled every
	// ProgressPoll (default 500ms) and printed ProgressEvery apart when it
	// is not a terminal (default progress.DefaultEvery).
	Progress      io.Writer
	ProgressEvery time.Duration
	ProgressPoll  time.Duration
}

// DefaultLockTimeout is InitOptions.LockTimeout's default.
const DefaultLockTimeout = 5 * time.Second

// Init creates what is missing: the outbox table with the index serving the
// poll query, the insert notify trigger (poll mode with capture.poll.notify;
// otherwise it removes it), the dead-letter table, what archive.mode needs
// (mark: the published_at column; move: the archive table), in wal mode
// the drain table, publication and slot, and what the sink needs (NATS
// stream, a fixed Kafka topic). It looks each object up first and issues no
// DDL for one that exists, builds indexes CONCURRENTLY (rebuilding one an
// interrupted run left INVALID), and waits for each table lock at most
// opts.LockTimeout, failing with a message naming the object. With
// opts.Role it grants that role what `relay run` needs. log receives the
// sink's logs.
func Init(ctx context.Context, cfg *config.Config, opts InitOptions, w io.Writer, log *slog.Logger) error {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = DefaultLockTimeout
	}
	l := layoutOf(cfg)
	if opts.DryRun {
		return initDryRun(ctx, cfg, l, opts.Role, w)
	}
	// A second connection samples index builds' progress.
	pool, err := connect(ctx, cfg.Postgres, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect to postgres %s: %w", describeDB(cfg.Postgres), redact.Error(err))
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", fmt.Sprint(opts.LockTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	if cfg.Capture.WAL.Messages() {
		err = initMessages(ctx, cfg, conn, opts, w)
	} else {
		err = initTables(ctx, cfg, pool, conn, opts, w)
	}
	if err != nil {
		return err
	}
	conn.Release()

	snk, err := openSink(ctx, cfg, log, pipelineWindow)
	if err != nil {
		return err
	}
	defer snk.Close()
	done, err := snk.prepare(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, done)
	return nil
}

// initTables is Init's database part for an outbox table: the outbox, the
// tables and indexes of Init's doc, in wal mode the drain table,
// publication and slot, and with opts.Role the grants.
func initTables(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, conn *pgxpool.Conn, opts InitOptions, w io.Writer) error {
	l := layoutOf(cfg)
	steps := initSteps(cfg, l, nil)
	if err := steps[0].Run(ctx, conn); err != nil {
		return err
	}
	info, err := schema.InspectFor(ctx, conn, l, cfg.Capture.Mode == "wal")
	if err != nil {
		return err
	}
	// The other tables take the existing outbox's column types.
	for _, s := range initSteps(cfg, l, info.Types)[1:] {
		if err := runStep(ctx, pool, conn, s, opts); err != nil {
			return err
		}
	}
	if err := inspectRing(ctx, conn, cfg, &info); err != nil {
		return err
	}
	if cfg.Capture.Mode == "wal" {
		if err := wal.Setup(ctx, conn, table.Layout(l), cfg.Capture.WAL.Slot, cfg.Capture.WAL.Publication, cfg.Capture.WAL.Failover); err != nil {
			return lockTimeout(err, "publication "+cfg.Capture.WAL.Publication)
		}
		fmt.Fprintf(w, "postgres: publication %s and replication slot %s ready\n", cfg.Capture.WAL.Publication, cfg.Capture.WAL.Slot)
	}
	fmt.Fprintf(w, "postgres: outbox %s, dead-letter table %s ready\n", l.Outbox, l.DeadLetter)
	if opts.Role != "" {
		if err := grantRole(ctx, conn, cfg, info, opts.Role, w); err != nil {
			return err
		}
	}
	return nil
}

// initMessages is Init for the table-free outbox (capture.wal.source
// messages): the dead-letter table, the publication and the slot, which
// must exist before the application emits its first message, and with
// opts.Role the grants; there is no outbox table. The sink is prepared by
// Init.
func initMessages(ctx context.Context, cfg *config.Config, conn *pgxpool.Conn, opts InitOptions, w io.Writer) error {
	l, wc := layoutOf(cfg), cfg.Capture.WAL
	if err := wal.SetupMessages(ctx, conn, table.Layout(l), wc.Slot, wc.Publication, wc.Failover); err != nil {
		return lockTimeout(err, "publication "+wc.Publication)
	}
	fmt.Fprintf(w, "postgres: dead-letter table %s, publication %s and replication slot %s ready for outbox messages with prefix %s\n",
		l.DeadLetter, wc.Publication, wc.Slot, wc.MessagePrefix)
	if opts.Role != "" {
		return grantRole(ctx, conn, cfg, schema.Info{}, opts.Role, w)
	}
	return nil
}

// grantRole grants role what `relay run` needs with cfg (seq is the seq
// column's sequence). The REPLICATION attribute of wal mode is left alone
// when role may replicate already; when granting it is refused for want of
// superuser, grantRole prints the statement a superuser must run and goes
// on, so that init fails only on what its own role could do.
func grantRole(ctx context.Context, conn *pgxpool.Conn, cfg *config.Config, info schema.Info, role string, w io.Writer) error {
	lacking := ""
	for _, stmt := range schema.GrantSQL(runPrivileges(cfg, info), role) {
		var err error
		switch {
		case !strings.HasPrefix(stmt, "ALTER ROLE "):
			_, err = conn.Exec(ctx, stmt)
		case mayReplicate(ctx, conn, role):
			fmt.Fprintf(w, "postgres: role %s may replicate already\n", role)
		default:
			_, err = conn.Exec(ctx, stmt)
			if pe := pgerr.Of(err); pe != nil && pe.Code == insufficientPrivilege {
				lacking, err = stmt, nil
			}
		}
		if err != nil {
			return fmt.Errorf("grant role %s what relay run needs: %w\nstatement: %s", role, err, stmt)
		}
	}
	if lacking == "" {
		fmt.Fprintf(w, "postgres: role %s granted what `relay run` needs\n", role)
		return nil
	}
	fmt.Fprintf(w, "postgres: role %s granted what `relay run` needs but REPLICATION, which only a superuser can grant; "+
		"`relay run` refuses to start without it. As a superuser, run:\n  %s;\n"+
		"(Amazon RDS/Aurora: GRANT rds_replication TO %s;)\n", role, lacking, schema.Q(role))
	return nil
}

// insufficientPrivilege is the SQLSTATE of a statement refused for want of
// a privilege, such as ALTER ROLE … REPLICATION by a role that is not a
// superuser.
const insufficientPrivilege = "42501"

// mayReplicate reports whether role may use replication
// (schema.RoleCanReplicate); false when that cannot be read.
func mayReplicate(ctx context.Context, conn *pgxpool.Conn, role string) bool {
	var can bool
	err := conn.QueryRow(ctx, schema.RoleCanReplicate, role).Scan(&can)
	return err == nil && can
}

// runStep runs s on conn; an index build reports its progress to
// opts.Progress.
func runStep(ctx context.Context, pool *pgxpool.Pool, conn *pgxpool.Conn, s schema.Step, opts InitOptions) error {
	run := func() error { return s.Run(ctx, conn) }
	if s.Repair == "" || opts.Progress == nil {
		return run()
	}
	poll := opts.ProgressPoll
	if poll <= 0 {
		poll = defaultIndexPoll
	}
	rep := progress.New(opts.Progress, s.Object, opts.ProgressEvery)
	return runIndexStep(ctx, pool, run, conn.Conn().PgConn().PID(), rep, poll)
}

// initDryRun prints the SQL of Init and, with role, the grants. When the
// outbox exists already, the grants name its actual seq sequence; the
// database is only read, and not needed at all otherwise.
func initDryRun(ctx context.Context, cfg *config.Config, l schema.Layout, role string, w io.Writer) error {
	fmt.Fprintln(w, "-- Run outside a transaction block (CREATE INDEX CONCURRENTLY), as the owner of the outbox table.")
	fmt.Fprintln(w, "-- SET lock_timeout = '5s'; -- and run again later if a statement times out waiting for the application's locks")
	fmt.Fprintln(w)
	var stmts []string
	if wc := cfg.Capture.WAL; wc.Messages() {
		stmts = wal.SetupMessagesSQL(table.Layout(l), wc.Slot, wc.Publication, wc.Failover)
	} else {
		for _, s := range initSteps(cfg, l, nil) {
			stmts = append(stmts, s.SQL())
		}
		if cfg.Capture.Mode == "wal" {
			_, ring := ringOf(cfg)
			stmts = append(stmts, wal.SetupSQL(table.Layout(l), wc.Slot, wc.Publication, wc.Failover, ring)...)
		}
	}
	for _, stmt := range stmts {
		fmt.Fprintf(w, "%s;\n\n", stmt)
	}
	fmt.Fprintf(w, "-- sink %s: created when missing by `relay init` and `relay run` (NATS stream, fixed Kafka topic)\n", cfg.Sink.Type)
	if role == "" {
		return nil
	}
	fmt.Fprintf(w, "\n-- Privileges of role %s for `relay run`, and nothing more:\n", role)
	for _, stmt := range grantSQL(cfg, existingInfo(ctx, cfg, l), role) {
		fmt.Fprintf(w, "%s;\n", stmt)
	}
	return nil
}

// existingInfo returns what schema.InspectFor learns of the outbox when the
// database is reachable and the outbox exists, or nothing (the default
// identity sequence name is then assumed).
func existingInfo(ctx context.Context, cfg *config.Config, l schema.Layout) schema.Info {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pcfg, err := pgConfig(ctx, cfg.Postgres, 1)
	if err != nil {
		return schema.Info{}
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig)
	if err != nil {
		return schema.Info{}
	}
	defer conn.Close(ctx)
	info, err := schema.InspectFor(ctx, conn, l, cfg.Capture.Mode == "wal")
	if err == nil {
		_ = inspectRing(ctx, conn, cfg, &info) // else the partitions get the names init gives them
	}
	return info
}

// initSteps returns what `relay init` creates for cfg (schema.Layout's
// InitSteps, or InitRingSteps with archive.mode partition) on an outbox
// whose column types are types (nil: the contract's).
func initSteps(cfg *config.Config, l schema.Layout, types map[string]string) []schema.Step {
	if r, ok := ringOf(cfg); ok {
		return l.InitRingSteps(r, types)
	}
	return l.InitSteps(notify(cfg), cfg.Archive.Mode, types)
}

// notify reports whether init installs the insert notify trigger.
func notify(cfg *config.Config) bool { return cfg.Capture.Mode == "poll" && cfg.Capture.Poll.Notify }

// lockTimeout gives a lock timeout of wal setup the message of
// schema.StepError.
func lockTimeout(err error, object string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return &schema.StepError{Step: schema.Step{Object: object}, Statement: "CREATE PUBLICATION", Err: err}
	}
	return err
}

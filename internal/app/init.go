package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

// Init creates what is missing: the outbox table with the index serving the
// poll query, the insert notify trigger (poll mode with capture.poll.notify;
// otherwise it removes it), the dead-letter table,
// what archive.mode needs (mark: the published_at column; move: the
// archive table) and what the sink needs (NATS stream, a fixed Kafka
// topic). With dryRun it prints the SQL and changes nothing. Every
// statement is idempotent, so Init can run on every deploy. log receives
// the sink's logs.
func Init(ctx context.Context, cfg *config.Config, dryRun bool, w io.Writer, log *slog.Logger) error {
	l := schema.FromConfig(cfg)
	if dryRun {
		stmts := initSQL(l, cfg, nil)
		if cfg.Capture.Mode == "wal" {
			stmts = append(stmts, wal.SetupSQL(l, cfg.Capture.WAL.Slot, cfg.Capture.WAL.Publication)...)
		}
		for _, stmt := range stmts {
			fmt.Fprintf(w, "%s;\n\n", stmt)
		}
		fmt.Fprintf(w, "-- sink %s: created when missing by `relay init` and `relay run` (NATS stream, fixed Kafka topic)\n", cfg.Sink.Type)
		return nil
	}
	pool, err := connect(ctx, cfg.Postgres.URL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, l.CreateOutbox()); err != nil {
		return fmt.Errorf("create outbox table %s: %w", l.Outbox, err)
	}
	info, err := schema.Inspect(ctx, pool, l)
	if err != nil {
		return err
	}
	for _, stmt := range initSQL(l, cfg, info.Types)[1:] {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("init: %w\nstatement: %s", err, stmt)
		}
	}
	if cfg.Capture.Mode == "wal" {
		if err := wal.Setup(ctx, pool, l, cfg.Capture.WAL.Slot, cfg.Capture.WAL.Publication); err != nil {
			return err
		}
		fmt.Fprintf(w, "postgres: publication %s and replication slot %s ready\n", cfg.Capture.WAL.Publication, cfg.Capture.WAL.Slot)
	}
	fmt.Fprintf(w, "postgres: outbox %s, dead-letter table %s ready\n", l.Outbox, l.DeadLetter)

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

// initSQL lists the statements of Init, the outbox table first. types are
// the existing outbox's column types, or nil for the contract's.
func initSQL(l schema.Layout, cfg *config.Config, types map[string]string) []string {
	stmts := []string{l.CreateOutbox(), l.CreatePollIndex()}
	if cfg.Capture.Mode == "poll" && cfg.Capture.Poll.Notify {
		stmts = append(stmts, l.CreateNotifyTrigger()...)
	} else {
		stmts = append(stmts, l.DropNotifyTrigger()...)
	}
	stmts = append(stmts, l.CreateDeadLetter(types)...)
	return append(stmts, l.ArchiveDDL(cfg.Archive.Mode, types)...)
}

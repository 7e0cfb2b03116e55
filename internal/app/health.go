package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

// outboxWarnings returns what slows capture on cfg's outbox table (a
// missing poll index, bloat) and the dead-letter index of earlier releases
// (see schema.Layout.Warnings).
func outboxWarnings(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) ([]schema.Warning, error) {
	return layoutOf(cfg).Warnings(ctx, pool, cfg.Capture.Mode == "poll", cfg.Archive.Mode)
}

// warnOutbox prints the outbox table's warnings for relay check; they do
// not fail the check.
func warnOutbox(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, w io.Writer) {
	ws, err := outboxWarnings(ctx, pool, cfg)
	if err != nil {
		fmt.Fprintf(w, "WARN  outbox table health: %v\n", err)
	}
	for _, x := range ws {
		fmt.Fprintf(w, "WARN  %s\n      fix: %s\n", x.What, x.Fix)
	}
}

// logOutboxWarnings logs the outbox table's warnings, one line each, when
// relay run starts.
func logOutboxWarnings(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, log *slog.Logger) {
	ws, err := outboxWarnings(ctx, pool, cfg)
	if err != nil {
		log.Warn("cannot inspect the outbox table's indexes and statistics", "err", err)
	}
	for _, x := range ws {
		log.Warn(x.What, "fix", x.Fix)
	}
}

// Package app wires the relay's commands together: it builds the capture
// source, the sink and the pipeline from a loaded config. cmd/relay parses
// the command line and maps the errors returned here to exit statuses.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// UsageError is a problem with the command line or the config that is found
// before the relay touches anything; the CLI exits with status 2 for it.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// IsUsage reports whether err calls for exit status 2: a UsageError or a
// config error.
func IsUsage(err error) bool {
	var u *UsageError
	var c *config.Error
	return errors.As(err, &u) || errors.As(err, &c)
}

// NewLogger returns the logger log.format and log.level ask for, writing to
// w. Every attribute goes through logAttr, so no line carries a credential,
// a control character or an unbounded value.
func NewLogger(cfg config.Log, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.Level))
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: logAttr}
	if cfg.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// logAttr passes a through redact.Attr, which also turns errors into
// strings, then escapes and cuts string values with rowtext.Error: an error
// may quote row values of any size and bytes.
func logAttr(groups []string, a slog.Attr) slog.Attr {
	a = redact.Attr(groups, a)
	if a.Value.Kind() == slog.KindString {
		a.Value = slog.StringValue(rowtext.Error(a.Value.String()))
	}
	return a
}

// connBudget is how relay run uses postgres.max_conns: the capture mode's
// dedicated connections, and a pool with the rest.
type connBudget struct {
	total, pooled int
	dedicated     string // what the dedicated connections are for
}

// budget splits postgres.max_conns for relay run. A value too small for the
// capture mode is a UsageError naming the key.
func budget(cfg *config.Config) (connBudget, error) {
	n, what := poll.DedicatedConns, "partition leases and LISTEN"
	if cfg.Capture.Mode == "wal" {
		n, what = wal.DedicatedConns, "replication, the leader lock and the backlog drain's leases"
	}
	b := connBudget{total: cfg.Postgres.MaxConns, pooled: cfg.Postgres.MaxConns - n, dedicated: fmt.Sprintf("%d for %s", n, what)}
	if b.pooled < 1 {
		return b, &UsageError{Err: fmt.Errorf("postgres.max_conns: %s capture needs at least %d connections (%s, and 1 pooled), got %d",
			cfg.Capture.Mode, n+1, b.dedicated, cfg.Postgres.MaxConns)}
	}
	return b, nil
}

func (b connBudget) String() string {
	return fmt.Sprintf("at most %d (%d pooled, %s)", b.total, b.pooled, b.dedicated)
}

// applicationName is set on every connection the relay opens, so operators
// can tell them apart in pg_stat_activity.
const applicationName = "outbox-relay"

// pgConfig parses postgres.url into a pool config of at most maxConns
// connections named applicationName, with the password of postgres.password
// or postgres.password_file, that, with postgres.aws_iam_auth, sign in with
// IAM tokens. A postgres.url that cannot be parsed, or evidently holds an
// unencoded password, is a UsageError saying what is wrong and never
// showing the URL.
func pgConfig(ctx context.Context, pg config.Postgres, maxConns int32) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(pg.URL)
	if problem := dsnProblem(pg.URL, err); problem != "" {
		return nil, &UsageError{Err: errors.New("postgres.url: " + problem)}
	}
	if err := setPassword(&pcfg.ConnConfig.Config, pg); err != nil {
		return nil, err
	}
	pcfg.MaxConns = maxConns
	pcfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	if region := pg.AWSIAMAuth.Region; region != "" {
		tokens, err := newTokenSource(ctx, region)
		if err != nil {
			return nil, err
		}
		useIAMAuth(&pcfg.ConnConfig.Config, tokens)
	}
	return pcfg, nil
}

// connect opens a pool to postgres.url and checks it answers. Errors name
// the database by target, without its password.
func connect(ctx context.Context, pg config.Postgres, maxConns int32) (*pgxpool.Pool, error) {
	return connectAs(ctx, pg, maxConns, applicationName)
}

// connectAs is connect with the connections' application_name set to name.
func connectAs(ctx context.Context, pg config.Postgres, maxConns int32, name string) (*pgxpool.Pool, error) {
	pcfg, err := pgConfig(ctx, pg, maxConns)
	if err != nil {
		return nil, err
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres %s: %w", target(&pcfg.ConnConfig.Config), redact.Error(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres %s: %w", target(&pcfg.ConnConfig.Config), redact.Error(err))
	}
	return pool, nil
}

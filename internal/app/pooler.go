package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/redact"
)

// errPooler says that postgres.url leads to a pooler that hands a client
// connection's statements to different server sessions.
var errPooler = errors.New("postgres.url leads to a transaction-pooling proxy (for example PgBouncer with pool_mode = transaction)")

// poolerFix is what to do about errPooler, for relay check's fix line and
// relay run's error.
const poolerFix = "the relay needs one server session per connection: its prepared statements " +
	`(otherwise "prepared statement \"stmtcache_...\" already exists"), the advisory locks of its leases, ` +
	"LISTEN and, in wal mode, replication break when the proxy moves a connection's statements between sessions; " +
	"point postgres.url at PostgreSQL itself (bypassing the pooler), or at a pooler in session mode (PgBouncer pool_mode = session)"

// sessionPinned checks that the server session of a connection to
// postgres.url stays the same between statements, as it does on a direct
// connection or through a session pooler; a transaction-pooling proxy
// fails it with errPooler. The probe opens two connections of pcfg's
// settings with unnamed statements and closes them: the first runs a
// statement, the second then holds a transaction open, and the first runs
// another. A pooler that reuses the session the first released, as
// PgBouncer does by default, gives it to the second; one that does not
// must give the first another session while the second holds its own.
func sessionPinned(ctx context.Context, pcfg *pgxpool.Config) error {
	cc := pcfg.ConnConfig.Copy()
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec // unnamed statements: no name a pooler could clash on, any client_encoding
	a, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer a.Close(context.WithoutCancel(ctx))
	b, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return err
	}
	defer b.Close(context.WithoutCancel(ctx))
	pid := func(c *pgx.Conn) (int32, error) {
		var p int32
		err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p)
		return p, err
	}
	first, err := pid(a)
	if err != nil {
		return fmt.Errorf("session probe: %w", err)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return fmt.Errorf("session probe: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	other, err := pid(b)
	if err != nil {
		return fmt.Errorf("session probe: %w", err)
	}
	if other == first {
		return fmt.Errorf("%w: two connections ran in the same server session (backend pid %d)", errPooler, first)
	}
	again, err := pid(a)
	if err != nil {
		return fmt.Errorf("session probe: %w", err)
	}
	if again != first {
		return fmt.Errorf("%w: one connection's statements ran in two server sessions (backend pids %d and %d)", errPooler, first, again)
	}
	return nil
}

// checkSession is sessionPinned for relay run: a pooler is a UsageError
// (exit status 2, no retry) naming postgres.url and the fix.
func checkSession(ctx context.Context, pg config.Postgres, pcfg *pgxpool.Config) error {
	err := sessionPinned(ctx, pcfg)
	if errors.Is(err, errPooler) {
		return &UsageError{Err: fmt.Errorf("postgres %s: %w; %s", redact.String(pg.URL), err, poolerFix)}
	}
	if err != nil {
		return fmt.Errorf("connect to postgres %s: %w", redact.String(pg.URL), err)
	}
	return nil
}

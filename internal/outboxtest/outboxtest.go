// Package outboxtest creates outbox tables in throwaway databases for the
// tests of the packages that capture from them (capture/internal/claim,
// capture/wal, pipeline). It is not in internal/testenv because the tests
// of internal/schema, whose DDL it runs, import testenv. Only tests may
// import it.
package outboxtest

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// Layout returns the layout of the documented tables, table.DefaultLayout.
func Layout() schema.Layout { return schema.Layout(table.DefaultLayout()) }

// DB creates the outbox of l, and its schema when that is not public, with
// its poll index in a fresh database (testenv.NewDB), and returns a pool on
// it whose sessions get the runtime parameters params (none when nil). The
// pool is closed when the test ends.
func DB(t testing.TB, l schema.Layout, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if l.Outbox.Schema != "public" {
		Exec(t, pool, "CREATE SCHEMA "+schema.Q(l.Outbox.Schema))
	}
	Exec(t, pool, l.CreateOutbox())
	Exec(t, pool, l.CreatePollIndex())
	return pool
}

// Exec runs sql with args on q and fails the test when it fails.
func Exec(t testing.TB, q schema.Querier, sql string, args ...any) {
	t.Helper()
	if _, err := q.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TextIDs turns the id column of the documented outbox on q into text, so
// that it holds UUIDs as an application may write them (see StoredIDs).
func TextIDs(t testing.TB, q schema.Querier) {
	t.Helper()
	Exec(t, q, `ALTER TABLE outbox ALTER COLUMN id TYPE text`)
}

// StoredIDs returns n new UUIDs written as an application may store them in
// a text id column: upper-case, braced, and both, in turn.
func StoredIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		id := uuid.NewString()
		switch i % 3 {
		case 0:
			ids[i] = strings.ToUpper(id)
		case 1:
			ids[i] = "{" + id + "}"
		default:
			ids[i] = "{" + strings.ToUpper(id) + "}"
		}
	}
	return ids
}

// InsertStoredID inserts an event of aggregate a whose id column holds
// stored as it is, and returns the canonical form its event carries.
func InsertStoredID(t testing.TB, q schema.Querier, stored string) string {
	t.Helper()
	Exec(t, q, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 't', 'a', 'e', '{}')`, stored)
	return strings.ToLower(strings.Trim(stored, "{}"))
}

// HeldTransactions returns how many client sessions of q's database, other
// than the one running the count, hold a transaction open between
// statements (idle in transaction, aborted or not): what a source that kept
// its claim's transaction while the pipeline publishes the batch leaves.
// A statement running at that moment in a transaction of its own, such as
// the periodic read of a slot guard or a partition lease, holds nothing
// across the publish and is not counted.
func HeldTransactions(t testing.TB, q schema.Querier) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
		AND state LIKE 'idle in transaction%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

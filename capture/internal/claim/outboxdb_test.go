package claim

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/internal/schema"
)

// outboxDB returns a pool on a new database holding the outbox table with
// its poll index, whose sessions get the runtime parameters params, and
// the table's layout.
func outboxDB(t *testing.T, params map[string]string) (*pgxpool.Pool, schema.Layout) {
	t.Helper()
	l := outboxtest.Layout()
	return outboxtest.DB(t, l, params), l
}

// leasedSource returns a source on pool that joined and leased its
// partitions; it is closed when the test ends.
func leasedSource(t *testing.T, pool *pgxpool.Pool, l schema.Layout) *Source {
	t.Helper()
	ctx := context.Background()
	s, err := New(ctx, Options{Pool: pool, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.connect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.lease.rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

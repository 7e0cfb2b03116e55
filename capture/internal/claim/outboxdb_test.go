package claim

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// outboxDB returns a pool on a new database holding the outbox table with
// its poll index, whose sessions get the runtime parameters params, and
// the table's layout.
func outboxDB(t *testing.T, params map[string]string) (*pgxpool.Pool, schema.Layout) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l := schema.Layout{
		Outbox: schema.Table{Schema: "public", Name: "outbox"},
		Cols: schema.Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
			EventType: "event_type", Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
		DeadLetter: schema.Table{Schema: "public", Name: "outbox_dead_letter"},
	}
	for _, q := range []string{l.CreateOutbox(), l.CreatePollIndex()} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return pool, l
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

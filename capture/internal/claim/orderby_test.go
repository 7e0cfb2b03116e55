package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/internal/schema"
)

// tenantLayout is layout ordered by a bigint tenant_id column.
var tenantLayout = func() schema.Layout {
	l := layout
	l.Cols.OrderBy = "tenant_id"
	return l
}()

// setupTenants creates the outbox with a nullable bigint tenant_id column.
func setupTenants(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := setup(t, layout)
	mustExec(t, pool, `ALTER TABLE outbox ADD COLUMN tenant_id bigint`)
	return pool
}

// insertTenant writes one row of aggregate agg for tenant (NULL when nil).
func insertTenant(t *testing.T, q schema.Querier, agg string, tenant *int) string {
	t.Helper()
	id := uuid.NewString()
	mustExec(t, q, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, tenant_id) VALUES ($1, 'order', $2, 'step', '{}', $3)`,
		id, agg, tenant)
	return id
}

// TestOrderByPartitions shows that with outbox.order_by the order column
// is the event's key (its text, or the aggregate id when NULL) and the
// partition key: two sources sharing the partitions never both claim rows
// of one tenant, although every row has its own aggregate.
func TestOrderByPartitions(t *testing.T) {
	pool := setupTenants(t)
	for i := range 200 {
		tenant := i % 20
		insertTenant(t, pool, fmt.Sprintf("agg-%d", i), &tenant)
	}
	nullID := insertTenant(t, pool, "agg-null", nil)
	a := newTenantSource(t, pool, false)
	b := newTenantSource(t, pool, false)
	var ba, bb capture.Batch
	for deadline := time.Now().Add(30 * time.Second); ba == nil || bb == nil; {
		for _, x := range []capture.Batch{ba, bb} {
			if x != nil {
				x.Abandon(context.Background())
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the two sources did not split the partitions")
		}
		ba, bb = next(t, a, 3*time.Second), next(t, b, 3*time.Second)
	}
	owner := map[string]string{}
	for name, bt := range map[string]capture.Batch{"a": ba, "b": bb} {
		for _, e := range bt.Events() {
			switch {
			case e.ID == nullID && (e.OrderKey != "" || e.Key() != "agg-null"):
				t.Fatalf("row with NULL tenant_id: OrderKey %q, Key %q; want the aggregate id as key", e.OrderKey, e.Key())
			case e.ID != nullID && e.Key() != e.OrderKey:
				t.Fatalf("event %s: Key %q, want its tenant %q", e.ID, e.Key(), e.OrderKey)
			}
			if o, ok := owner[e.Key()]; ok && o != name {
				t.Fatalf("tenant %s claimed by both sources", e.Key())
			}
			owner[e.Key()] = name
		}
	}
	if n := len(ba.Events()) + len(bb.Events()); n != 201 {
		t.Fatalf("claimed %d rows, want 201", n)
	}
}

// TestOrderByDeadLetterAndPark shows that a dead letter keeps the order
// column, parks the other aggregates of its tenant, and is redriven with
// its tenant_id.
func TestOrderByDeadLetterAndPark(t *testing.T) {
	pool := setupTenants(t)
	one, two := 1, 2
	dead := insertTenant(t, pool, "x", &one)
	src := newTenantSource(t, pool, true)
	b := next(t, src, 10*time.Second)
	if b == nil || len(b.Events()) != 1 {
		t.Fatalf("batch %v, want the one row", b)
	}
	now := time.Now().UnixNano()
	if err := b.Complete(context.Background(), capture.Outcome{Dead: []capture.DeadEvent{
		{Event: b.Events()[0], Err: "boom", Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now}}}); err != nil {
		t.Fatal(err)
	}
	var tenant int
	if err := pool.QueryRow(context.Background(), `SELECT tenant_id FROM outbox_dead_letter WHERE id = $1`, dead).Scan(&tenant); err != nil || tenant != 1 {
		t.Fatalf("dead letter tenant_id %d (%v), want 1", tenant, err)
	}
	parked := insertTenant(t, pool, "y", &one) // another aggregate of tenant 1
	free := insertTenant(t, pool, "y", &two)
	var got []string
	for deadline := time.Now().Add(20 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		if x := next(t, src, 2*time.Second); x != nil {
			got = append(got, ids(x.Events())...)
			complete(t, x)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]string{free}) {
		t.Fatalf("claimed %v, want only %s: tenant 1 is parked", got, free)
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if n, _, err := tenantLayout.Redrive(context.Background(), tx, schema.DeadLetterFilter{}, true); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(context.Background(), `SELECT id::text || '/' || tenant_id FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		left = append(left, s)
	}
	if want := []string{dead + "/1", parked + "/1"}; fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("outbox after redrive %v, want %v (the dead letter with its tenant, then the parked row)", left, want)
	}
}

func newTenantSource(t *testing.T, pool *pgxpool.Pool, park bool) *claim.Source {
	t.Helper()
	src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: tenantLayout, BatchSize: 1000,
		Interval: 20 * time.Millisecond, ParkAggregates: park})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

package claim_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batchCounter counts the pipelined batches (round trips) sent on the
// connections of a pool.
type batchCounter struct{ n atomic.Int64 }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *batchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// tracedPool returns a pool on a new outbox (setup) whose connections,
// the source's lease connection too, report to tracer.
func tracedPool(t *testing.T, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := setup(t, layout).Config()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestHeldBackRowsClaimedInOneRoundTrip shows that rows held back by an
// open writer are claimed by the first claim after the writer committed,
// and that this claim, watermark check included, is one round trip.
func TestHeldBackRowsClaimedInOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	counter := &batchCounter{}
	pool := tracedPool(t, counter)
	src := newSource(t, pool, layout, 100)
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	first := insert(t, slow, "order-1", 1)
	second := insert(t, pool, "order-1", 2)
	if b := next(t, src, 300*time.Millisecond); b != nil {
		t.Fatalf("claimed %v while seq 1 is uncommitted", ids(b.Events()))
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	counter.n.Store(0)
	b := next(t, src, 5*time.Second)
	if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{first, second}) {
		t.Fatalf("after commit claimed %v, want [%s %s]", b, first, second)
	}
	if n := counter.n.Load(); n != 1 {
		t.Errorf("the claim took %d round trips, want 1", n)
	}
	complete(t, b)
}

// locksCounter counts the pipelined statements that read pg_locks.
type locksCounter struct {
	batchCounter
	n atomic.Int64
}

func (c *locksCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "pg_locks") {
		c.n.Add(1)
	}
}

// TestSteadyClaimsReadNoLocks: while every seq up to the sequence's last
// value is committed, claims of a relay that leases every partition raise
// their watermark over the visible seqs and read neither the open writers
// nor the leases from pg_locks, whose every read takes all of the lock
// manager's partition locks.
func TestSteadyClaimsReadNoLocks(t *testing.T) {
	counter := &locksCounter{}
	pool := tracedPool(t, counter)
	src := newSource(t, pool, layout, 100)
	insert(t, pool, "a", 0)
	complete(t, next(t, src, 5*time.Second)) // the first claim reads the writers
	counter.n.Store(0)
	for i := range 20 {
		want := insert(t, pool, "a", i+1)
		b := next(t, src, 5*time.Second)
		if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{want}) {
			t.Fatalf("claim %d: claimed %v, want [%s]", i, b, want)
		}
		complete(t, b)
	}
	if n := counter.n.Load(); n != 0 {
		t.Errorf("20 claims of committed rows read pg_locks %d times, want 0", n)
	}
}

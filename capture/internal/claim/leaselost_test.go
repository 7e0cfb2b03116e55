package claim

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
)

// TestLostLeaseClaimsNothing shows that a claim runs in the session that
// holds the leases: after the relay's lease connection died and another
// relay took every partition over, the claim fails and claims none of the
// rows the other relay has in flight.
func TestLostLeaseClaimsNothing(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	a := leasedSource(t, pool, l)
	if len(a.lease.owned) != a.opts.Partitions {
		t.Fatalf("owns %d partitions", len(a.lease.owned))
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, a.lease.conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease connection did not end")
		}
	}
	b := leasedSource(t, pool, l)
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || i, 'created', '{}' FROM generate_series(1, 20) AS i`); err != nil {
		t.Fatal(err)
	}
	inFlight, err := b.Next(ctx)
	if err != nil || len(inFlight.Events()) != 20 {
		t.Fatalf("the other relay claimed %v, %v", inFlight, err)
	}
	defer inFlight.Abandon(ctx)
	got, err := a.claim(ctx)
	if got != nil {
		t.Fatalf("the relay that lost its leases claimed %d rows the other relay has in flight", len(got.Events()))
	}
}

// TestFoldedArchiveOfLostClaim: a completion folded into a claim whose
// lease connection died archives its rows in a transaction of its own.
func TestFoldedArchiveOfLostClaim(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	a := leasedSource(t, pool, l)
	insertRow(t, a, "a")
	b := claimOne(t, a)
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, a.lease.conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	completed := make(chan error, 1)
	keepClaiming(a)
	go func() { completed <- b.Complete(ctx, capture.Outcome{Published: b.Events()}) }()
	waitFolded(t, a, 1)
	if got, err := a.claim(ctx); err == nil {
		t.Fatalf("a claim on the dead lease connection claimed %v", got)
	}
	select {
	case err := <-completed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Complete did not return within a minute")
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}

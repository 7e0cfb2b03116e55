package claim

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
)

// waitFolded waits until n completions of s wait for a claim.
//
// Call keepClaiming before the completion starts: on a loaded machine the
// completion otherwise may run alone (the poller seems stopped after
// foldWait) before waitFolded sees it wait.
func waitFolded(t *testing.T, s *Source, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		s.folds.mu.Lock()
		k := len(s.folds.waiting)
		s.folds.mu.Unlock()
		if k == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d completions wait for a claim, want %d", k, n)
		}
	}
}

// keepClaiming makes s's poller look as if a claim runs, until the next
// claim ends: completions then wait for that claim to take them.
func keepClaiming(s *Source) { s.folds.claiming.Store(true) }

// insertRow inserts one outbox row of aggregate agg through s's pool.
func insertRow(t *testing.T, s *Source, agg string) {
	t.Helper()
	if _, err := s.opts.Pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'order', $1, 'created', '{}')`, agg); err != nil {
		t.Fatal(err)
	}
}

// claimOne claims the one row in s's outbox.
func claimOne(t *testing.T, s *Source) capture.Batch {
	t.Helper()
	b, err := s.Next(context.Background())
	if err != nil || len(b.Events()) != 1 {
		t.Fatalf("claimed %v, %v", b, err)
	}
	return b
}

// lockOutbox holds an ACCESS EXCLUSIVE lock on the outbox, as a migration
// would, in a transaction rolled back at the end of the test.
func lockOutbox(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Rollback(ctx) })
	if _, err := locker.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	return locker
}

// checkLeaseConnection fails t when s's lease connection (and with it its
// leases) is gone.
func checkLeaseConnection(t *testing.T, s *Source) {
	t.Helper()
	if s.lease.conn == nil || s.lease.conn.IsClosed() {
		t.Fatal("the failed claim closed the lease connection (gave up the leases)")
	}
}

// TestFailedFoldedClaimKeepsLeaseConnection: while an application holds
// an ACCESS EXCLUSIVE lock on the outbox, a claim fails at its statement
// timeout and keeps the lease connection (its leases), whether or not a
// completion was folded into it: the claim is tried again without the
// completion only when a folded statement timed out waiting for a row
// lock.
func TestFailedFoldedClaimKeepsLeaseConnection(t *testing.T) {
	for _, fold := range []bool{false, true} {
		name := "alone"
		if fold {
			name = "folded"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			pool, l := outboxDB(t, nil)
			a := leasedSource(t, pool, l)
			insertRow(t, a, "a") // one folded completion first, so that the claim's statements are prepared
			b := claimOne(t, a)
			done := make(chan error, 1)
			complete := func() { done <- b.Complete(ctx, capture.Outcome{Published: b.Events()}) }
			keepClaiming(a)
			go complete()
			waitFolded(t, a, 1)
			if _, err := a.claim(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			insertRow(t, a, "a")
			b = claimOne(t, a)
			locker := lockOutbox(t, pool)
			if fold {
				keepClaiming(a)
				go complete()
				waitFolded(t, a, 1)
			}
			start := time.Now()
			_, err := a.claim(ctx)
			t.Logf("the claim failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if err == nil {
				t.Fatal("the claim did not fail")
			}
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if !fold {
				complete()
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			checkLeaseConnection(t, a)
		})
	}
}

// TestClaimPreparedUnderLockKeepsLeaseConnection: the first claim on a new
// lease connection prepares its statements outside its transaction; while
// an application holds an ACCESS EXCLUSIVE lock on the outbox that
// preparation fails at the lease connection's statement timeout, before
// the client gives up and closes the connection (and its leases).
func TestClaimPreparedUnderLockKeepsLeaseConnection(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	a := leasedSource(t, pool, l)
	lockOutbox(t, pool)
	start := time.Now()
	_, err := a.claim(ctx)
	t.Logf("the claim failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil {
		t.Fatal("the claim did not fail")
	}
	checkLeaseConnection(t, a)
}

// TestRefusedFoldedArchiveIsNotTheClaims: a folded archive that a trigger
// refuses fails on its own, as an archive failure; the claim it was
// folded into is tried again without it and claims the next row.
func TestRefusedFoldedArchiveIsNotTheClaims(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	a := leasedSource(t, pool, l)
	if _, err := pool.Exec(ctx, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'archiving refused by a trigger'; END $$;
		CREATE TRIGGER refuse BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`); err != nil {
		t.Fatal(err)
	}
	insertRow(t, a, "a")
	b := claimOne(t, a)
	insertRow(t, a, "b")
	done := make(chan error, 1)
	keepClaiming(a)
	go func() { done <- b.Complete(ctx, capture.Outcome{Published: b.Events()}) }()
	waitFolded(t, a, 1)
	next, err := a.claim(ctx)
	if err != nil {
		t.Fatalf("the claim failed with its folded archive: %v", err)
	}
	if next == nil || len(next.Events()) != 1 {
		t.Fatalf("claimed %v, want the row of b", next)
	}
	if err := <-done; err == nil {
		t.Fatal("the refused archive was reported as done")
	}
}

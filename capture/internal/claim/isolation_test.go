package claim

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestClaimReadCommittedUnderRepeatableReadDefault shows that the claim's
// snapshot follows its watermark check even where sessions default to
// repeatable read: a writer holding back seq 1 commits after the claiming
// transaction began but before safeBound released it, and the claim takes
// seq 1 and 2 together instead of seq 2 alone. The claim is stalled at its
// work locks, which the test holds, to place the commit there.
func TestClaimReadCommittedUnderRepeatableReadDefault(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, map[string]string{"default_transaction_isolation": "repeatable read"})
	s := leasedSource(t, pool, l)
	const ins = `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'order', 'a', 'step', '{}') RETURNING id::text`
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	var first, second string
	if err := slow.QueryRow(ctx, ins).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, ins).Scan(&second); err != nil {
		t.Fatal(err)
	}
	if b, err := s.claim(ctx); err != nil || b != nil {
		t.Fatalf("claimed %v (%v) while seq 1 is uncommitted", b, err)
	}

	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT pg_advisory_xact_lock($1, p) FROM unnest($2::int[]) AS p`,
		s.lease.keys.work, s.lease.owned); err != nil {
		t.Fatal(err)
	}
	type result struct {
		b   *batch
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := s.claim(ctx)
		done <- result{b, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim did not wait for its work locks")
		}
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var got []string
	if r.b != nil {
		for _, ev := range r.b.Events() {
			got = append(got, ev.ID)
		}
		defer r.b.Abandon(ctx)
	}
	if want := []string{first, second}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claimed %v after the writer of seq 1 committed, want %v", got, want)
	}
}

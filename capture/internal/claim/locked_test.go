package claim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestLockedRowHoldsItsAggregate has another session lock an outbox row
// (FOR KEY SHARE, as a foreign key check does, or FOR UPDATE, as an
// application's UPDATE does) while newer rows of its aggregate and of
// another aggregate are written: the claims skip the locked row, so they
// must hold its aggregate's newer rows back and let the other aggregate
// through; once the lock is released the locked row comes first.
func TestLockedRowHoldsItsAggregate(t *testing.T) {
	for _, mode := range []string{"FOR KEY SHARE", "FOR UPDATE"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			pool := setup(t, layout)
			src := newSource(t, pool, layout, 100)
			a1 := insert(t, pool, "a", 1)
			locker, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Rollback(ctx)
			mustExec(t, locker, "SELECT 1 FROM outbox WHERE id = $1 "+mode, a1)
			a2 := insert(t, pool, "a", 2)
			b1 := insert(t, pool, "b", 1)
			var claimed []string
			for deadline := time.Now().Add(time.Minute); !slices.Contains(claimed, b1); {
				if time.Now().After(deadline) {
					t.Fatalf("b1 not claimed within a minute while a1 is locked; claimed %v", claimed)
				}
				if b := next(t, src, 5*time.Second); b != nil {
					claimed = append(claimed, ids(b.Events())...)
					complete(t, b)
				}
			}
			// A claim that began before b1 was written may still be
			// running: give the claims a few more rounds.
			for range 3 {
				if b := next(t, src, 300*time.Millisecond); b != nil {
					claimed = append(claimed, ids(b.Events())...)
					complete(t, b)
				}
			}
			if slices.Contains(claimed, a2) {
				t.Fatalf("claimed %v while a1 was locked: a2 passed a1", claimed)
			}
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); !slices.Contains(claimed, a2); {
				if time.Now().After(deadline) {
					t.Fatalf("a1 and a2 not claimed within a minute after the lock was released; claimed %v", claimed)
				}
				if b := next(t, src, 5*time.Second); b != nil {
					claimed = append(claimed, ids(b.Events())...)
					complete(t, b)
				}
			}
			if want := []string{b1, a1, a2}; fmt.Sprint(claimed) != fmt.Sprint(want) {
				t.Fatalf("claimed %v, want %v", claimed, want)
			}
			if n := count(t, pool, "outbox"); n != 0 {
				t.Fatalf("%d rows left in the outbox", n)
			}
		})
	}
}

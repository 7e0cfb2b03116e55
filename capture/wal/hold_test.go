package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/outboxtest"
)

// TestDrainHoldsNoTransaction shows that a batch of the drain of rows older
// than the slot holds no transaction while it is published.
func TestDrainHoldsNoTransaction(t *testing.T) {
	pool := setup(t, layout)
	insert(t, pool, "a", 1) // before the slot exists: drained
	insert(t, pool, "a", 2)
	src := newSource(t, options(t, pool, layout, 10))
	b := next(t, src, 20*time.Second)
	if b == nil || len(b.Events()) != 2 {
		t.Fatalf("drained batch %v, want the 2 rows", b)
	}
	settled := false
	defer func() {
		if !settled {
			b.Abandon(context.Background())
		}
	}()
	if n := outboxtest.HeldTransactions(t, pool); n != 0 {
		t.Fatalf("%d transactions held open while a drained batch is in flight", n)
	}
	settled = true
	complete(t, b)
	waitFor(t, 10*time.Second, "the outbox to be archived", func() bool { return count(t, pool, "outbox") == 0 })
}

package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/wal"
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

// TestReleaseDrainsBeforeReceivedRows: a newer row of a held aggregate
// that the stream received while it was held, and had not handed out when
// the aggregate was released (the pipeline's reader was busy), comes after
// the held row, which the drain publishes first. The pipeline lifts the
// aggregate's park at the first batch of a Next called after Release, so
// that Next must not hand out the stream's open batch: it did (the order
// break of TestReceiverRefusesMidStream/wal, "step 3 after step 13").
func TestReleaseDrainsBeforeReceivedRows(t *testing.T) {
	pool := setup(t, layout)
	src := newStreaming(t, options(t, pool, layout, 10))
	held := insert(t, pool, "a", 1)
	b := next(t, src, 10*time.Second)
	if b == nil || len(b.Events()) != 1 || b.Events()[0].ID != held {
		t.Fatalf("streamed batch %v, want [%s]", b, held)
	}
	src.Hold("a")
	if err := b.Complete(context.Background(), capture.Outcome{}); err != nil { // a:1 left in the outbox
		t.Fatal(err)
	}
	newer := insert(t, pool, "a", 2)
	waitFor(t, 10*time.Second, "the stream to receive a:2", func() bool { return wal.Received(src) == 1 })
	src.Release([]string{"a"})

	b = next(t, src, 20*time.Second)
	if b == nil {
		t.Fatal("no batch after Release")
	}
	if got := ids(b.Events()); len(got) != 1 || got[0] != held {
		t.Fatalf("first batch after Release %v, want the held row a:1 %s (a:2 is %s)", got, held, newer)
	}
	complete(t, b)
	b = next(t, src, 20*time.Second)
	if b == nil {
		t.Fatal("a:2 not captured after the drain")
	}
	if got := ids(b.Events()); len(got) != 1 || got[0] != newer {
		t.Fatalf("second batch after Release %v, want a:2 %s", got, newer)
	}
	complete(t, b)
	waitFor(t, 10*time.Second, "the outbox to be archived", func() bool { return count(t, pool, "outbox") == 0 })
}

// TestReleaseDuringDrainRewinds: a drain whose claims skipped a held
// aggregate's rows claims from the first seq once the aggregate is
// released, so its older row comes before its newer one; claiming on from
// its cursor, past the older row, handed out the newer row first.
func TestReleaseDuringDrainRewinds(t *testing.T) {
	pool := setup(t, layout)
	older := insert(t, pool, "a", 1) // before the slot exists: drained
	other := insert(t, pool, "b", 1)
	newer := insert(t, pool, "a", 2)
	src := newSource(t, options(t, pool, layout, 1))
	src.Hold("a")
	b := next(t, src, 20*time.Second)
	if b == nil {
		t.Fatal("nothing drained")
	}
	if got := ids(b.Events()); len(got) != 1 || got[0] != other {
		t.Fatalf("drained %v with a held, want b:1 %s", got, other)
	}
	src.Release([]string{"a"})
	var got []string
	for _, bb := range append([]capture.Batch{b}, collect(t, src, 2, 20*time.Second)...) {
		got = append(got, ids(bb.Events())...)
		complete(t, bb)
	}
	if len(got) != 3 || got[1] != older || got[2] != newer {
		t.Fatalf("drained %v, want b:1 %s, then a:1 %s before a:2 %s", got, other, older, newer)
	}
}

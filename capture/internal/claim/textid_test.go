package claim_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/internal/outboxtest"
)

// TestTextIDsArchivedAsStored uses a text id column holding UUIDs as an
// application may write them: upper-case, braced, or both. The events carry
// the canonical id; the rows are archived (poll archives by seq) and the
// dead letter keeps the id as stored.
func TestTextIDsArchivedAsStored(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	outboxtest.TextIDs(t, pool)
	src := newSource(t, pool, layout, 10)
	stored := outboxtest.StoredIDs(3)
	var want []string
	for _, id := range stored {
		want = append(want, outboxtest.InsertStoredID(t, pool, id))
	}
	b := next(t, src, 10*time.Second)
	if b == nil || !slices.Equal(ids(b.Events()), want) {
		t.Fatalf("claimed %v, want the canonical ids %v", b, want)
	}
	evs := b.Events()
	now := time.Now().UnixNano()
	o := capture.Outcome{Published: evs[:2], Dead: []capture.DeadEvent{
		{Event: evs[2], Err: "too big", Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now}}}
	if err := b.Complete(ctx, o); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox", n)
	}
	var id string
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox_dead_letter`).Scan(&id); err != nil || id != stored[2] {
		t.Fatalf("dead letter id %q (%v), want %q as stored", id, err, stored[2])
	}
}

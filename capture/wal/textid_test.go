package wal_test

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
// the canonical id, and the rows must still be archived (the archive
// statement matches the id as stored) and dead-lettered with the id as
// stored, on both archive paths: a batch with only published events, and
// one with a dead event.
func TestTextIDsArchivedAsStored(t *testing.T) {
	pool := setup(t, layout)
	outboxtest.TextIDs(t, pool)
	mustExec(t, pool, `CREATE TABLE outbox_dead_letter (LIKE outbox)`)
	mustExec(t, pool, `ALTER TABLE outbox_dead_letter ADD dead_lettered_at timestamptz NOT NULL DEFAULT now(),
		ADD error text, ADD error_class text, ADD attempts int, ADD first_failed_at timestamptz, ADD last_failed_at timestamptz`)
	src := newStreaming(t, options(t, pool, layout, 10))
	ctx := context.Background()
	write := func(stored string) string { return outboxtest.InsertStoredID(t, pool, stored) }
	stored := outboxtest.StoredIDs(4)
	upper, braced, both := stored[0], stored[1], stored[2]
	want := []string{write(upper), write(braced)}
	bs := collect(t, src, 2, 10*time.Second)
	if got := ids(events(bs)); !slices.Equal(got, want) {
		t.Fatalf("event ids %v, want the canonical %v", got, want)
	}
	for _, b := range bs {
		complete(t, b)
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox after publishing the only rows", n)
	}
	dead, kept := write(both), write(stored[3])
	bs = collect(t, src, 2, 10*time.Second)
	if got := ids(events(bs)); !slices.Equal(got, []string{dead, kept}) {
		t.Fatalf("event ids %v, want [%s %s]", got, dead, kept)
	}
	now := time.Now().UnixNano()
	for _, b := range bs {
		var o capture.Outcome
		for _, ev := range b.Events() {
			if ev.ID == dead {
				o.Dead = append(o.Dead, capture.DeadEvent{Event: ev, Err: "too big", Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now})
			} else {
				o.Published = append(o.Published, ev)
			}
		}
		if err := b.Complete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox after publishing one and dead-lettering the other", n)
	}
	var id string
	if err := pool.QueryRow(ctx, `SELECT id FROM outbox_dead_letter`).Scan(&id); err != nil || id != both {
		t.Fatalf("dead letter id %q (%v), want %q as stored", id, err, both)
	}
}

// TestTextIDsReplayedAsStored restarts a source whose stream handed out,
// and did not archive, rows of a text id column holding non-canonical
// UUIDs: the replayed batch's look-up matches the ids as stored, so the
// events are delivered again rather than taken for archived.
func TestTextIDsReplayedAsStored(t *testing.T) {
	pool := setup(t, layout)
	outboxtest.TextIDs(t, pool)
	o := options(t, pool, layout, 10)
	src := newStreaming(t, o)
	var want []string
	for _, stored := range outboxtest.StoredIDs(2) {
		want = append(want, outboxtest.InsertStoredID(t, pool, stored))
	}
	collect(t, src, 2, 10*time.Second)
	src.Close()
	o.Logger = testLog(t)
	again := newSource(t, o)
	if got := ids(events(collect(t, again, 2, 10*time.Second))); !slices.Equal(got, want) {
		t.Fatalf("replayed %v, want %v", got, want)
	}
}

package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/outboxtest"
)

// TestNoTransactionWhileInFlight shows that a claimed batch holds neither a
// transaction nor row locks while it is published: the application can
// lock its rows at once.
func TestNoTransactionWhileInFlight(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 10)
	for i := range 3 {
		insert(t, pool, "a", i)
	}
	b := next(t, src, 5*time.Second)
	if b == nil {
		t.Fatal("no batch")
	}
	ctx := context.Background()
	settled := false
	defer func() {
		if !settled {
			b.Abandon(ctx)
		}
	}()
	if n := outboxtest.HeldTransactions(t, pool); n != 0 {
		t.Fatalf("%d transactions held open while the batch is in flight", n)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT * FROM outbox FOR UPDATE NOWAIT`); err != nil {
		t.Fatalf("claimed rows are locked while in flight: %v", err)
	}
	tx.Rollback(ctx)
	settled = true
	complete(t, b)
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// TestRescanSkipsRowsInFlight shows that a claim that looks again from the
// oldest row (here after an abandoned batch) does not claim the rows of a
// batch still in flight a second time.
func TestRescanSkipsRowsInFlight(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 3)
	var want []string
	for i := range 5 {
		want = append(want, insert(t, pool, "a", i))
	}
	b1 := next(t, src, 5*time.Second)
	b2 := next(t, src, 5*time.Second)
	if b1 == nil || b2 == nil || fmt.Sprint(ids(b2.Events())) != fmt.Sprint(want[3:]) {
		t.Fatalf("claimed %v and %v", b1, b2)
	}
	b2.Abandon(context.Background())
	b3 := next(t, src, 5*time.Second)
	if b3 == nil || fmt.Sprint(ids(b3.Events())) != fmt.Sprint(want[3:]) {
		t.Fatalf("after abandoning the second batch claimed %v, want %v (the first batch is still in flight)", b3, want[3:])
	}
	complete(t, b1)
	complete(t, b3)
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// TestArchiveOnlyPublished completes a batch of which only some rows were
// published, with gaps inside their seq range: exactly those rows leave
// the outbox, also when they are archived with the range statement.
func TestArchiveOnlyPublished(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 10)
	var all []string
	for i := range 10 {
		all = append(all, insert(t, pool, "a", i))
	}
	b := next(t, src, 5*time.Second)
	if b == nil || len(b.Events()) != 10 {
		t.Fatalf("claimed %v, want 10 rows", b)
	}
	evs := b.Events()
	published := []*event.Event{evs[0], evs[1], evs[2], evs[5], evs[6], evs[7]}
	if err := b.Complete(context.Background(), capture.Outcome{Published: published}); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(context.Background(), `SELECT id::text FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{all[3], all[4], all[8], all[9]}; fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("outbox holds %v, want the unpublished rows %v", left, want)
	}
}

package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
)

func newBoundedSource(t *testing.T, pool *pgxpool.Pool, maxSeq int64) *claim.Source {
	t.Helper()
	src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: layout, BatchSize: 10,
		Interval: 20 * time.Millisecond, MaxSeq: maxSeq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// nextOrDrained claims with a timeout and reports ErrDrained.
func nextOrDrained(t *testing.T, src *claim.Source, d time.Duration) (capture.Batch, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	b, err := src.Next(ctx)
	if errors.Is(err, claim.ErrDrained) {
		return nil, true
	}
	if err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	return b, false
}

// TestMaxSeqDrains shows that a bounded source claims only rows up to
// MaxSeq, reports ErrDrained while its own batches are open and after they
// were completed, and claims abandoned rows again before that.
func TestMaxSeqDrains(t *testing.T) {
	pool := setup(t, layout)
	var want []string
	for i := range 5 {
		want = append(want, insert(t, pool, "a", i))
	}
	src := newBoundedSource(t, pool, 3)
	b, drained := nextOrDrained(t, src, 5*time.Second)
	if drained || b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint(want[:3]) {
		t.Fatalf("claimed %v (drained %v), want %v", b, drained, want[:3])
	}
	if _, drained := nextOrDrained(t, src, 5*time.Second); !drained {
		t.Fatal("no ErrDrained while the bounded rows are claimed")
	}
	b.Abandon(context.Background())
	b, drained = nextOrDrained(t, src, 5*time.Second)
	if drained || b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint(want[:3]) {
		t.Fatalf("abandoned rows: claimed %v (drained %v), want %v", b, drained, want[:3])
	}
	complete(t, b)
	if _, drained := nextOrDrained(t, src, 5*time.Second); !drained {
		t.Fatal("no ErrDrained after completing")
	}
	if n := count(t, pool, "outbox"); n != 2 {
		t.Fatalf("%d rows left, want the 2 above the bound", n)
	}
}

// TestMaxSeqWaitsForOpenWriters shows ErrDrained waits for a transaction
// that drew a seq ≤ MaxSeq and is still open.
func TestMaxSeqWaitsForOpenWriters(t *testing.T) {
	pool := setup(t, layout)
	ctx := context.Background()
	first := insert(t, pool, "a", 1)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	second := insert(t, tx, "a", 2)
	src := newBoundedSource(t, pool, 2)
	var claimed []string
	claim := func(d time.Duration) bool {
		b, drained := nextOrDrained(t, src, d)
		if b != nil {
			claimed = append(claimed, ids(b.Events())...)
			complete(t, b)
		}
		return drained
	}
	for range 3 { // seq 1 is committed and may be claimed; seq 2 not yet
		if claim(300*time.Millisecond) || slices.Contains(claimed, second) {
			t.Fatalf("claimed %v, drained, while seq 2 is uncommitted", claimed)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(claimed, second); {
		if time.Now().After(deadline) || claim(5*time.Second) {
			t.Fatalf("claimed %v (or drained) after the writer committed, want %s too", claimed, second)
		}
	}
	if fmt.Sprint(claimed) != fmt.Sprint([]string{first, second}) {
		t.Fatalf("claimed %v, want [%s %s]", claimed, first, second)
	}
	if !claim(5 * time.Second) {
		t.Fatal("no ErrDrained after the writer committed")
	}
}

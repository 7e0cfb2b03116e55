package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
)

// TestDeadLetterLockBounded: another session holds a row lock on an
// outbox row (SELECT … FOR UPDATE in an open transaction) when the row's
// batch is completed with it dead. The dead-letter transaction must give
// up within its bound, failing the archive (the stream restarts and the
// row comes again), instead of blocking capture until the lock goes; once
// the lock is gone the row is dead-lettered.
func TestDeadLetterLockBounded(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 10)
	src := newStreaming(t, o)
	id := insert(t, pool, "a", 1)
	b := next(t, src, 20*time.Second)
	if b == nil || len(b.Events()) != 1 {
		t.Fatalf("batch %v, want the row", b)
	}
	ctx := context.Background()
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- b.Complete(ctx, capture.Outcome{Dead: []capture.DeadEvent{{Event: b.Events()[0], Err: "poison", Class: "permanent",
			Attempts: 1, FirstFailed: time.Now().UnixNano(), LastFailed: time.Now().UnixNano()}}})
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the dead letter was written while another session held the row's lock")
		}
		t.Logf("archive failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(60 * time.Second):
		t.Fatal("the dead-letter transaction still waits for the row lock after 60s")
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b = nil
	again, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for b == nil && again.Err() == nil {
		b, _ = src.Next(again) // the failed archive ended the stream: Next fails once, then reconnects
	}
	if b == nil || len(b.Events()) != 1 || b.Events()[0].ID != id {
		t.Fatalf("after the failed archive the row did not come again: %v", b)
	}
	if err := b.Complete(ctx, capture.Outcome{Dead: []capture.DeadEvent{{Event: b.Events()[0], Err: "poison", Class: "permanent",
		Attempts: 1, FirstFailed: time.Now().UnixNano(), LastFailed: time.Now().UnixNano()}}}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, "outbox_dead_letter"); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
}

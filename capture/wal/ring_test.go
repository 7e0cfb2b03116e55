package wal_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/pipeline"
)

// testRing is a ring of 3 partitions of 10 seqs: seqs 1-9 go to
// outbox_p0, 10-19 to outbox_p1, 20-29 to outbox_p2, 30-39 to outbox_p0.
var testRing = schema.Ring{Partitions: 3, Rows: 10}

// setupRing creates the ring outbox of testRing, as `relay init` does, in
// a fresh database and returns a pool on it.
func setupRing(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range layout.InitRingSteps(testRing, nil) {
		if err := s.Run(context.Background(), pool); err != nil {
			t.Fatal(err)
		}
	}
	return pool
}

// ringOptions returns source options for the ring outbox on pool.
func ringOptions(t *testing.T, pool *pgxpool.Pool) wal.Options {
	o := options(t, pool, layout, 100)
	o.ArchiveMode, o.Partitions, o.PartitionRows = schema.ArchivePartition, testRing.Partitions, testRing.Rows
	return o
}

// gate is a sink that fails the events of aggregate "late" while closed
// and records every event it publishes.
type gate struct {
	recorder
	open atomic.Bool
}

func (g *gate) Publish(ctx context.Context, batch []*event.Event) error {
	for _, ev := range batch {
		if ev.AggregateID == "late" && !g.open.Load() {
			return errors.New("gate closed")
		}
	}
	return g.recorder.Publish(ctx, batch)
}

// runForever runs a pipeline from src to snk that retries without end
// (nothing is dead-lettered) until the test ends.
func runForever(t *testing.T, src *wal.Source, snk publisher) {
	ctx, cancel := context.WithCancel(context.Background())
	p := pipeline.New(src, snk, pipeline.Options{Logger: discard(), ShutdownTimeout: 10 * time.Second,
		Retry: pipeline.Retry{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, MaxAttempts: 1 << 30}})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v", err)
		}
	})
}

// insertN inserts n rows of aggregate agg, steps 1 to n, each in its own
// transaction, and writes them to log.
func insertN(t *testing.T, pool *pgxpool.Pool, log *verify.Log, agg string, n int) {
	for i := range n {
		log.Written(insert(t, pool, agg, i+1), agg, i+1)
	}
}

// rowsIn returns the rows of partition k of the ring.
func rowsIn(t *testing.T, pool *pgxpool.Pool, k int) int {
	return count(t, pool, layout.Partition(k).Ident())
}

// deletes returns the rows deleted from the outbox's partitions.
func deletes(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(n_tup_del), 0)::int FROM pg_stat_user_tables WHERE relname LIKE 'outbox_p%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRingTruncatesPublishedPartitions(t *testing.T) {
	t.Parallel()
	pool := setupRing(t)
	src := newStreaming(t, ringOptions(t, pool))
	if src.HoldsInOutbox() {
		t.Fatal("HoldsInOutbox: the ring outbox holds no aggregates")
	}
	rec := &recorder{log: verify.NewLog()}
	runForever(t, src, rec)
	insertN(t, pool, rec.log, "a", 25) // p0: 1-9, p1: 10-19, p2: 20-25
	waitFor(t, 20*time.Second, "25 events", func() bool { return rec.n.Load() >= 25 })
	waitFor(t, 20*time.Second, "two truncations", func() bool { return src.Truncations() == 2 })
	if n := rowsIn(t, pool, 0) + rowsIn(t, pool, 1); n != 0 {
		t.Errorf("p0 and p1 hold %d rows, want 0", n)
	}
	if n := rowsIn(t, pool, 2); n != 6 {
		t.Errorf("p2 holds %d rows, want 6: the partition of the newest seq is not truncated", n)
	}
	if n := deletes(t, pool); n != 0 {
		t.Errorf("%d rows deleted from the outbox, want 0", n)
	}
	checkDelivered(t, rec.log)
}

func TestRingKeepsUnpublishedRows(t *testing.T) {
	t.Parallel()
	pool := setupRing(t)
	src := newStreaming(t, ringOptions(t, pool))
	snk := &gate{recorder: recorder{log: verify.NewLog()}}
	runForever(t, src, snk)
	ctx := context.Background()
	// An open transaction draws seq 1 and commits after every other row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	snk.log.Written(insert(t, tx, "late", 1), "late", 1)
	insertN(t, pool, snk.log, "a", 24) // seqs 2-25
	waitFor(t, 20*time.Second, "24 events", func() bool { return snk.n.Load() >= 24 })
	time.Sleep(3 * time.Second) // three truncator ticks
	if n := src.Truncations(); n != 0 || rowsIn(t, pool, 1) != 10 {
		t.Fatalf("%d truncations and %d rows in p1 while seq 1 is uncommitted: want 0 and 10", n, rowsIn(t, pool, 1))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed, but its destination fails: the slot is not confirmed
	// past its commit, so nothing committed before it is truncated.
	time.Sleep(3 * time.Second)
	if n := src.Truncations(); n != 0 || rowsIn(t, pool, 0) != 9 {
		t.Fatalf("%d truncations and %d rows in p0 while seq 1 is unpublished: want 0 and 9", n, rowsIn(t, pool, 0))
	}
	snk.open.Store(true)
	waitFor(t, 20*time.Second, "p0 and p1 truncated", func() bool { return src.Truncations() == 2 })
	if n := rowsIn(t, pool, 0) + rowsIn(t, pool, 1); n != 0 {
		t.Errorf("p0 and p1 hold %d rows, want 0", n)
	}
	checkDelivered(t, snk.log)
}

func TestRingLockTimeoutPutsOffTruncation(t *testing.T) {
	t.Parallel()
	pool := setupRing(t)
	src := newStreaming(t, ringOptions(t, pool))
	rec := &recorder{log: verify.NewLog()}
	runForever(t, src, rec)
	ctx := context.Background()
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	outboxtest.Exec(t, reader, `LOCK TABLE `+layout.Partition(0).Ident()+` IN ACCESS SHARE MODE`)
	insertN(t, pool, rec.log, "a", 25)
	waitFor(t, 20*time.Second, "p1 truncated and p0 put off", func() bool {
		return rowsIn(t, pool, 1) == 0 && src.TruncateLockTimeouts() > 0
	})
	if n := rowsIn(t, pool, 0); n != 9 {
		t.Fatalf("p0 holds %d rows while another session reads it, want 9", n)
	}
	if !src.Capturing() {
		t.Error("a lock timeout made the source report a failure")
	}
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "p0 truncated", func() bool { return rowsIn(t, pool, 0) == 0 })
	checkDelivered(t, rec.log)
}

// checkDelivered fails unless every event written to log was delivered,
// in order per aggregate.
func checkDelivered(t *testing.T, log *verify.Log) {
	t.Helper()
	if err := log.Check().Err(); err != nil {
		t.Error(err)
	}
}

package claim

import (
	"context"
	"testing"
	"time"
)

// TestGapReadsWritersSoon: a seq missing for gapInterval makes the next
// claim read the open writers (a rolled-back seq holds the rows behind it
// about that long, not blockedInterval plus a claim); while it stays
// missing the writers are read again only every blockedInterval.
func TestGapReadsWritersSoon(t *testing.T) {
	s := &Source{opts: Options{Partitions: 1}, lease: leases{owned: []int32{0}}, contiguous: true}
	now := time.Now()
	s.gapAt, s.gapSince = 7, now
	if s.readWriters(now.Add(gapInterval / 2)) {
		t.Error("a seq missing for less than gapInterval reads the writers")
	}
	if !s.readWriters(now.Add(gapInterval)) {
		t.Error("a seq missing for gapInterval does not read the writers")
	}
	s.locksAt = now.Add(gapInterval)
	if s.readWriters(now.Add(gapInterval + blockedInterval/2)) {
		t.Error("the writers are read again within blockedInterval of the last read")
	}
	if !s.readWriters(now.Add(gapInterval + blockedInterval)) {
		t.Error("the writers are not read again blockedInterval after the last read")
	}
	s.contiguous = false
	if s.gapAt = 0; !s.readWriters(now) {
		t.Error("without a unique index on seq a claim does not read the writers")
	}
}

// TestFullScanIsNoGap: a claim whose bound statement found every seq it
// looked at visible (it stopped at its limit below H) records no missing seq.
func TestFullScanIsNoGap(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	s, err := New(ctx, Options{Pool: pool, Layout: l, BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ins := `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'a', 'e', '{}' FROM generate_series(1, 5)`
	for round := range 2 {
		if _, err := pool.Exec(ctx, ins); err != nil {
			t.Fatal(err)
		}
		b, err := s.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b.Abandon(ctx)
		if round == 1 && s.gapAt != 0 {
			t.Errorf("after a claim that saw only visible seqs up to its limit, seq %d is recorded missing", s.gapAt)
		}
	}
}

// TestReconnectForgetsWatermark: a new lease connection (after a failover,
// to a server whose sequence may be behind) starts the safe seq again from
// nothing, and its first claim reads the open writers.
func TestReconnectForgetsWatermark(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	s := leasedSource(t, pool, l)
	s.marks.safe, s.gapAt = 1000, 0
	s.lease.conn.Close(ctx)
	if err := s.connect(ctx); err != nil {
		t.Fatal(err)
	}
	if s.marks.safe != 0 || !s.readWriters(time.Now()) {
		t.Errorf("after reconnecting the safe seq is %d (want 0) and the first claim reads the writers: %v", s.marks.safe, s.readWriters(time.Now()))
	}
}

// TestClaimDeadlineKeepsLeases: a Next whose context ends while its claim
// waits on the server does not close the lease connection (pgx closes a
// connection whose query a context interrupts): the claim runs to its end
// and the relay keeps its leases.
func TestClaimDeadlineKeepsLeases(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	s := leasedSource(t, pool, l)
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `SELECT pg_advisory_xact_lock($1, p) FROM unnest($2::int[]) AS p`,
		s.lease.keys.work, s.lease.owned); err != nil {
		t.Fatal(err)
	}
	conn := s.lease.conn
	released := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		released <- blocker.Commit(ctx)
	}()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = s.Next(short)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("Next returned a batch of an empty outbox")
	}
	if s.lease.conn != conn || conn.IsClosed() {
		t.Error("a claim interrupted by Next's context closed the lease connection")
	}
}

// TestGapWaitFollowsWriters: after a missing seq appeared by itself (its
// writer committed) 4 ms after a claim found it missing, the next missing
// seq waits twice that before a claim reads the open writers, instead of
// gapInterval; after a read of the writers released a missing seq (rolled
// back), the next one waits gapInterval again. The wait stays between
// gapInterval and blockedInterval.
func TestGapWaitFollowsWriters(t *testing.T) {
	s := &Source{opts: Options{Partitions: 1}, lease: leases{owned: []int32{0}}, contiguous: true}
	now := time.Now()
	s.recordReadings(&readings{head: 2, safe: 0, visible: 0, limit: 500}, 1<<62, now)
	if s.gapAt != 1 {
		t.Fatalf("gapAt %d, want 1", s.gapAt)
	}
	now = now.Add(4 * time.Millisecond)
	s.recordReadings(&readings{head: 4, safe: 2, visible: 2, limit: 500}, 1<<62, now) // seq 1 appeared; 3 missing
	if s.gapAt != 3 || s.gapWait() != 8*time.Millisecond {
		t.Fatalf("gapAt %d, gapWait %v; want 3, 8ms", s.gapAt, s.gapWait())
	}
	if s.readWriters(now.Add(5 * time.Millisecond)) {
		t.Error("a seq missing for 5 ms reads the writers while they commit within 4")
	}
	if !s.readWriters(now.Add(8 * time.Millisecond)) {
		t.Error("a seq missing for 8 ms does not read the writers")
	}
	now = now.Add(8 * time.Millisecond)
	s.locksAt = now
	s.recordReadings(&readings{locks: true, head: 6, safe: 4, visible: 2, open: []string{"3/7"}, limit: 500}, 1<<62, now) // 3 released by the read, a writer open
	if s.gapAt != 5 || s.gapWait() != gapInterval {
		t.Fatalf("gapAt %d, gapWait %v; want 5, %v", s.gapAt, s.gapWait(), gapInterval)
	}
	now = now.Add(time.Second)
	s.recordReadings(&readings{head: 8, safe: 6, visible: 6, limit: 500}, 1<<62, now) // 5 appeared after a second
	if s.gapWait() != blockedInterval {
		t.Fatalf("gapWait %v after a seq missing for a second, want %v", s.gapWait(), blockedInterval)
	}
}

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

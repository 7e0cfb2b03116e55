package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestPartitionSlotLoss drops the replication slot of a running relay in
// archive mode partition after the ring wrapped, and commits events while
// the slot is missing: the relay recreates the slot (logged and counted as
// dropped), publishes from the table what the slot cannot stream (the rows
// committed meanwhile and the published rows not yet truncated, again with
// their ids), loses nothing, keeps per-aggregate order and truncates the
// ring again once the drain is over.
func TestPartitionSlotLoss(t *testing.T) {
	t.Parallel()
	s, addr := partitionStack(t)
	relay := s.start()
	ctx := context.Background()
	s.produce(ctx, 2500, 100, 4)
	s.waitDrained(90 * time.Second)
	s.loseSlot(func() { s.produce(ctx, 500, 100, 4) })
	waitMetrics(t, addr, `relay_replication_slot_recreated_total{reason="dropped"} 1`)
	// Seqs 3001 to 4500: the drain deletes what it publishes, so the
	// partition of seqs 3000 to 3999 is emptied only by a truncation.
	s.produce(ctx, 1500, 100, 4)
	s.waitDrained(90 * time.Second)
	s.waitRingTruncated()
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	wire, stream := s.verify()
	logs := relay.logs.String()
	for _, want := range []string{"replication slot dropped; recreating it", "publishing outbox rows committed before the slot existed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the relay did not log %q", want)
		}
	}
	t.Logf("archive mode partition, slot dropped: %s; stream: %s", wire, stream)
}

// TestTableFreeSlotLoss drops the replication slot of a running relay of
// the table-free outbox (capture.wal.source messages) and emits messages
// while it is missing: as docs/operations.md says, those are lost (none of
// them may be delivered), the relay recreates the slot, says so in an ERROR
// line and counts it, and relays the messages emitted afterwards; the ones
// before the loss were all delivered.
func TestTableFreeSlotLoss(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Messages: true, LeastPrivilege: true})
	addr := s.withHTTP()
	relay := s.start()
	ctx := context.Background()
	s.produce(ctx, 300, 20, 2)
	s.waitDrained(60 * time.Second)
	// The messages emitted while the slot is missing are not recorded as
	// written: a delivery of one is reported as foreign by verify.
	s.loseSlot(func() {
		for i := range 20 {
			payload := fmt.Sprintf(`{"aggregate":"lost","step":%d}`, i+1)
			if _, err := s.pool.Exec(ctx, s.writeSQL(), uuid.NewString(), "lost", payload, "step"); err != nil {
				t.Fatal(err)
			}
		}
	})
	waitFor(t, func() bool {
		return strings.Contains(relay.logs.String(), "level=ERROR msg=\"replication slot recreated: the outbox messages committed while it was missing or lost are lost for good")
	})
	waitMetrics(t, addr, `relay_replication_slot_recreated_total{reason="dropped"} 1`)
	s.produce(ctx, 300, 20, 2)
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	wire, stream := s.verify()
	t.Logf("table-free, slot dropped: %s; stream: %s", wire, stream)
}

// loseSlot drops the stack's replication slot under its running relay and
// runs during while the slot is missing: a transaction holding a
// transaction id stays open until during returns, so that a slot the relay
// recreates meanwhile reaches its consistent point only after everything
// during committed (logical decoding waits for the transactions running
// when a slot is created).
func (s *stack) loseSlot(during func()) {
	s.t.Helper()
	ctx := context.Background()
	open, err := s.pool.Begin(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if _, err := open.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		s.t.Fatal(err)
	}
	dropSlot(s.t, s)
	during()
}

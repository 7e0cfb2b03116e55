package schema

import (
	"context"
	"fmt"
	"hash/fnv"
)

// Relays on one outbox must agree on how they capture: poll relays with
// different capture.poll.partitions would split the aggregates differently
// and claim one aggregate's rows at once, and a poll relay beside a wal
// relay would publish the same rows in two orders. So each relay holds,
// for its lifetime, a shared advisory lock on (the outbox's mode key, its
// configuration: the partition count in poll mode, 0 in wal mode) on a
// session connection it keeps anyway, and looks in pg_locks for a lock of
// the same key with another configuration.

// ModeConflict is the error JoinMode returns when another relay on the
// outbox runs with another configuration. It is permanent: retrying does
// not fix it.
type ModeConflict struct {
	Table       string
	Mine, Other int32 // partition counts; 0 is wal mode
}

func (e *ModeConflict) Error() string {
	return fmt.Sprintf("another relay runs on outbox %s with %s, this one with %s: every relay on one outbox must use the same capture.mode and capture.poll.partitions; stop one of them or align their configs",
		e.Table, describeMode(e.Other), describeMode(e.Mine))
}

// Retryable reports false: the conflict lasts until a relay is stopped.
func (e *ModeConflict) Retryable() bool { return false }

func describeMode(partitions int32) string {
	if partitions == 0 {
		return "capture.mode wal"
	}
	return fmt.Sprintf("capture.mode poll and capture.poll.partitions %d", partitions)
}

// modeKey is the advisory lock key of table's capture configuration.
func modeKey(table string) int32 {
	h := fnv.New32a()
	h.Write([]byte("outbox-relay:mode:" + table))
	return int32(h.Sum32() & 0x7fffffff)
}

// JoinMode takes this relay's shared configuration lock on conn, a session
// connection that lives as long as the relay captures (the lock goes with
// it), and returns a *ModeConflict when a relay with another configuration
// holds one for table. partitions is capture.poll.partitions in poll mode
// and 0 in wal mode. Taking the lock before looking means that of two
// relays starting at once, at least one sees the other.
func JoinMode(ctx context.Context, conn Querier, table string, partitions int) error {
	key, mine := modeKey(table), int32(partitions)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1, $2)`, key, mine); err != nil {
		return fmt.Errorf("take the capture mode lock: %w", err)
	}
	var others []int32
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT objid::bigint::int), '{}') FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 2
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = $1::int::oid AND objid <> $2::int::oid`, key, mine).Scan(&others)
	if err != nil {
		return fmt.Errorf("look for relays with another capture mode: %w", err)
	}
	if len(others) > 0 {
		return &ModeConflict{Table: table, Mine: mine, Other: others[0]}
	}
	return nil
}

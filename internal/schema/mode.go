package schema

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Relays on one outbox must agree on how they capture: poll relays with
// different capture.poll.partitions or outbox.order_by would split the
// rows differently and claim rows of one ordering key at once, and a poll
// relay beside a wal relay would publish the same rows in two orders. So
// each relay holds, for its lifetime, a shared advisory lock on (the
// outbox's mode key, its configuration) on a session connection it keeps
// anyway, and looks in pg_locks for a lock of the same key with another
// configuration. The configuration is one int32: the partition count in
// poll mode (0 in wal mode) in the low partitionBits bits, and above them
// a tag of the order column, 0 for the aggregate id.

// partitionBits holds capture.poll.partitions (at most 1024).
const partitionBits = 11

// ModeConflict is the error JoinMode returns when another relay on the
// outbox runs with another configuration. It is permanent: retrying does
// not fix it.
type ModeConflict struct {
	Table       string
	Mine, Other int32  // configurations, see above
	OrderBy     string // this relay's order column; empty: the aggregate id
}

func (e *ModeConflict) Error() string {
	return fmt.Sprintf("another relay runs on outbox %s with %s, this one with %s: every relay on one outbox must use the same capture.mode, capture.poll.partitions and outbox.order_by; stop one of them or align their configs",
		e.Table, e.describe(e.Other), e.describe(e.Mine))
}

// Retryable reports false: the conflict lasts until a relay is stopped.
func (e *ModeConflict) Retryable() bool { return false }

func (e *ModeConflict) describe(config int32) string {
	s := "capture.mode wal"
	if p := config & (1<<partitionBits - 1); p != 0 {
		s = fmt.Sprintf("capture.mode poll and capture.poll.partitions %d", p)
	}
	switch tag := config >> partitionBits; {
	case tag == 0 && (e.Mine>>partitionBits != 0 || e.Other>>partitionBits != 0):
		s += " and the default outbox.order_by"
	case tag != 0 && tag == orderTag(e.OrderBy):
		s += " and outbox.order_by " + e.OrderBy
	case tag != 0:
		s += " and another outbox.order_by"
	}
	return s
}

// orderTag is the configuration's tag of order column col: 0 for none (the
// aggregate id), else a hash of its name that is not 0.
func orderTag(col string) int32 {
	if col == "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(col))
	return max(int32(h.Sum32()&(1<<(31-partitionBits)-1)), 1)
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
// holds one for l's outbox. partitions is capture.poll.partitions in poll
// mode and 0 in wal mode. Taking the lock before looking means that of two
// relays starting at once, at least one sees the other.
func JoinMode(ctx context.Context, conn Querier, l Layout, partitions int) error {
	table := l.Outbox.String()
	key, mine := modeKey(table), int32(partitions)|orderTag(l.Cols.OrderBy)<<partitionBits
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
		return &ModeConflict{Table: table, Mine: mine, Other: others[0], OrderBy: l.Cols.OrderBy}
	}
	return nil
}

// RelaySession is one relay running on an outbox, seen through the
// session connection that holds its capture configuration lock (see
// JoinMode).
type RelaySession struct {
	// PID is the backend pid of the relay's lock session.
	PID int32
	// Client is the session's client address and port ("local" for a Unix
	// socket, empty when the role may not see it).
	Client string
	// Since is when the session connected.
	Since time.Time
	// Application is the session's application_name, which every role
	// may see.
	Application string
	// Exclusive lists the objid of every exclusive advisory lock (of the
	// two-int form) the session holds: wal capture's leader lock (objid 0)
	// in wal mode, the partition leases in poll mode.
	Exclusive []int32
}

// Relays returns the relays that run on l's outbox, oldest session first,
// from pg_locks and pg_stat_activity. Any role can read them; a role sees
// the client address of its own sessions only.
func Relays(ctx context.Context, q Querier, l Layout) ([]RelaySession, error) {
	rows, err := q.Query(ctx, `SELECT m.pid, coalesce(host(a.client_addr) || ':' || a.client_port, CASE WHEN a.client_port = -1 THEN 'local' END, ''),
		  coalesce(a.backend_start, now()), coalesce(a.application_name, ''),
		  coalesce((SELECT array_agg(x.objid::bigint::int ORDER BY x.objid::bigint) FROM pg_locks x
		    WHERE x.pid = m.pid AND x.locktype = 'advisory' AND x.granted AND x.mode = 'ExclusiveLock'
		      AND x.objsubid = 2 AND x.database = m.database), '{}')
		FROM pg_locks m LEFT JOIN pg_stat_activity a ON a.pid = m.pid
		WHERE m.locktype = 'advisory' AND m.granted AND m.objsubid = 2 AND m.classid = $1::int::oid
		  AND m.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY 3, 1`, modeKey(l.Outbox.String()))
	if err != nil {
		return nil, fmt.Errorf("list the relays on %s: %w", l.Outbox, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RelaySession, error) {
		var r RelaySession
		err := row.Scan(&r.PID, &r.Client, &r.Since, &r.Application, &r.Exclusive)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list the relays on %s: %w", l.Outbox, err)
	}
	return out, nil
}

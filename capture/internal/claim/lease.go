package claim

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// # Scale-out
//
// The outbox is split into partitions by a hash of the ordering key
// (schema.Columns.Key: the aggregate id by default), so all events of one
// key fall in one partition. Each relay leases some
// partitions and claims only their rows; relays balance the partitions
// between them and take over the partitions of a relay that went away.
// Three kinds of advisory locks, all keyed by the outbox table:
//
//   - member (shared, on the lease connection): counts the live relays;
//   - lease(p) (exclusive, on the lease connection): who owns partition p;
//   - work(p): every claiming transaction takes it shared for the
//     partitions it claims.
//
// Claims run on the lease connection, in the session that holds lease(p):
// a session keeps its advisory locks until it unlocks them or ends, and an
// ending session rolls its open claim back, so a claim commits only while
// its relay holds lease(p). A relay releases a partition between two of its
// claims. A relay that gains p holds lease(p) and then takes work(p)
// exclusively once, which succeeds only when no claiming transaction of a
// previous owner is still open (relays of earlier versions claimed on other
// connections and checked lease(p) in pg_locks; this barrier waits for
// their claims); only then does it claim p's rows, starting from the oldest
// unarchived one. So only one relay claims p's rows at a time; batches the
// previous owner claimed earlier may still be in flight and are delivered
// twice, each copy in seq order (docs/design.md). This holds through
// rebalancing, crashes (kill -9 ends the session and its locks) and a lost
// lease connection.

// rebalanceInterval is how often a relay recounts the relays and adjusts its
// partitions; a dead relay's partitions are taken over within about this
// long after Postgres notices its connection closed.
const rebalanceInterval = time.Second

// lockKeys are the advisory lock namespaces of one outbox table.
type lockKeys struct{ member, lease, work int32 }

func newLockKeys(table string) lockKeys {
	key := func(kind string) int32 {
		h := fnv.New32a()
		h.Write([]byte("outbox-relay:" + kind + ":" + table))
		return int32(h.Sum32() & 0x7fffffff)
	}
	return lockKeys{member: key("member"), lease: key("lease"), work: key("work")}
}

// leases tracks the partitions this relay owns. It is used only by the
// goroutine calling Source.Next.
type leases struct {
	keys     lockKeys
	n        int
	conn     *pgx.Conn // holds member and lease locks; also LISTENs
	owned    []int32   // leased and past the work barrier: claimable
	waiting  []int32   // leased, waiting for an old owner's claims to end
	next     time.Time
	log      *slog.Logger
	onGained func()       // called when partitions were gained
	nOwned   atomic.Int32 // len(owned), for Source.Partitions
}

// join registers conn as a member.
func (l *leases) join(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1, 0)`, l.keys.member); err != nil {
		return fmt.Errorf("join relays: %w", err)
	}
	l.conn, l.owned, l.waiting, l.next = conn, nil, nil, time.Time{}
	return nil
}

// lost forgets every lease after the lease connection broke.
func (l *leases) lost() {
	if len(l.owned)+len(l.waiting) > 0 {
		l.log.Warn("lost the lease connection; claiming stops until it is back", "partitions", len(l.owned))
	}
	l.conn, l.owned, l.waiting = nil, nil, nil
	l.nOwned.Store(0)
}

// rebalance runs at most every rebalanceInterval: it releases partitions
// above this relay's fair share, leases free ones up to it, and passes the
// work barrier of newly leased ones.
func (l *leases) rebalance(ctx context.Context) error {
	if time.Now().Before(l.next) {
		return nil
	}
	l.next = time.Now().Add(rebalanceInterval)
	var members int
	if err := l.conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid = $1::int::oid AND objid = 0 AND objsubid = 2`, l.keys.member).Scan(&members); err != nil {
		return fmt.Errorf("count relays: %w", err)
	}
	share := (l.n + max(members, 1) - 1) / max(members, 1)
	before := len(l.owned)
	if err := l.release(ctx, len(l.owned)+len(l.waiting)-share); err != nil {
		return err
	}
	if err := l.acquire(ctx, share-len(l.owned)-len(l.waiting)); err != nil {
		return err
	}
	if err := l.barrier(ctx); err != nil {
		return err
	}
	l.nOwned.Store(int32(len(l.owned)))
	if len(l.owned) != before {
		l.log.Info("partitions leased", "owned", len(l.owned), "of", l.n, "relays", members)
	}
	if len(l.owned) > before && l.onGained != nil {
		l.onGained()
	}
	return nil
}

// release gives up k partitions, waiting ones first.
func (l *leases) release(ctx context.Context, k int) error {
	for ; k > 0; k-- {
		var p int32
		if len(l.waiting) > 0 {
			p, l.waiting = l.waiting[len(l.waiting)-1], l.waiting[:len(l.waiting)-1]
		} else {
			p, l.owned = l.owned[len(l.owned)-1], l.owned[:len(l.owned)-1]
		}
		if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, l.keys.lease, p); err != nil {
			return fmt.Errorf("release partition %d: %w", p, err)
		}
	}
	return nil
}

// acquire tries to lease up to k free partitions.
func (l *leases) acquire(ctx context.Context, k int) error {
	if k <= 0 {
		return nil
	}
	held := l.held()
	for p := int32(0); p < int32(l.n) && k > 0; p++ {
		if slices.Contains(held, p) {
			continue
		}
		var ok bool
		if err := l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, l.keys.lease, p).Scan(&ok); err != nil {
			return fmt.Errorf("lease partition %d: %w", p, err)
		}
		if ok {
			l.waiting = append(l.waiting, p)
			k--
		}
	}
	return nil
}

// held returns every leased partition.
func (l *leases) held() []int32 { return slices.Concat(l.owned, l.waiting) }

// barrier moves leased partitions whose previous owner has no claiming
// transaction open any more to owned.
func (l *leases) barrier(ctx context.Context) error {
	keep := l.waiting[:0]
	for _, p := range l.waiting {
		var free bool
		err := l.conn.QueryRow(ctx, `SELECT CASE WHEN pg_try_advisory_lock($1, $2)
			THEN pg_advisory_unlock($1, $2) ELSE false END`, l.keys.work, p).Scan(&free)
		if err != nil {
			return fmt.Errorf("partition %d barrier: %w", p, err)
		}
		if free {
			l.owned = append(l.owned, p)
		} else {
			keep = append(keep, p)
		}
	}
	l.waiting = keep
	slices.Sort(l.owned)
	return nil
}

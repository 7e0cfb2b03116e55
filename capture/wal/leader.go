package wal

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/wait"
)

// standbyInterval is how often a relay that is not the leader tries to
// take over, and the first wait after the lock connection failed.
const standbyInterval = time.Second

// reconnectMax caps the wait between attempts to take the lock while they
// fail: it doubles from standbyInterval up to it, so an outage costs few
// attempts and the relay captures again within seconds of its end.
const reconnectMax = 5 * time.Second

// pingInterval is how often the leader checks its lock connection; pings
// that take longer than pingTimeout count as a lost connection.
const (
	pingInterval = time.Second
	pingTimeout  = 5 * time.Second
)

// leadership holds the session advisory lock that makes one relay at a
// time capture from an outbox table in wal mode. Its goroutine (run) owns
// the lock connection; wait is safe for concurrent use.
type leadership struct {
	cfg    *pgx.ConnConfig
	key    int32
	table  string
	layout schema.Layout
	log    *slog.Logger
	// fails reports the failed attempts to take the lock as runs; down is
	// set from a failed attempt until the lock connection answers again.
	fails *outage.Log
	down  atomic.Bool

	mu      sync.Mutex
	err     error           // a conflict that ends capture, see schema.JoinMode
	term    context.Context // ends when the lock is lost; nil while standing by
	changed chan struct{}   // closed and replaced whenever term changes
}

func newLeadership(cfg *pgx.ConnConfig, layout schema.Layout, log *slog.Logger) *leadership {
	table := layout.Outbox.String()
	h := fnv.New32a()
	h.Write([]byte("outbox-relay:wal:" + table))
	return &leadership{cfg: cfg, key: int32(h.Sum32() & 0x7fffffff), table: table, layout: layout, log: log, changed: make(chan struct{}),
		fails: outage.New(log, "cannot take the wal capture lock; retrying", "the wal capture lock's connection works again")}
}

// wait blocks until this relay leads and returns a context that ends when
// it stops leading.
func (l *leadership) wait(ctx context.Context) (context.Context, error) {
	for {
		l.mu.Lock()
		term, changed, err := l.term, l.changed, l.err
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if term != nil && term.Err() == nil {
			return term, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// reachable reports whether the lock connection is up and its last
// statement worked, whether this relay leads or stands by.
func (l *leadership) reachable() bool { return !l.down.Load() }

// leading reports whether this relay holds the lock now.
func (l *leadership) leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term != nil && l.term.Err() == nil
}

func (l *leadership) set(term context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.term = term
	close(l.changed)
	l.changed = make(chan struct{})
}

// run connects, takes the lock when it is free (retrying every
// standbyInterval) and holds it until ctx ends or the connection breaks,
// then starts over. While attempts fail (Postgres down) the wait between
// them doubles up to reconnectMax, and the failures are logged as a run
// (see outage.Log).
func (l *leadership) run(ctx context.Context) {
	standby := false
	for ctx.Err() == nil {
		err := l.attempt(ctx, &standby)
		var conflict *schema.ModeConflict
		if errors.As(err, &conflict) {
			return // capture ends: wait returns it
		}
		if err == nil || ctx.Err() != nil {
			continue
		}
		l.down.Store(true)
		n := l.fails.Fail(err, "table", l.table)
		wait.Sleep(ctx, min(standbyInterval<<min(n-1, 8), reconnectMax))
	}
}

// attempt connects, joins the capture mode and holds the lock while the
// connection answers. It returns why the connection failed, or nil when
// the lock was held until the connection broke (the ping logs that) or ctx
// ended. A mode conflict is returned as *schema.ModeConflict and recorded
// for wait.
func (l *leadership) attempt(ctx context.Context, standby *bool) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		conn.Close(cctx) // releases the lock
		cancel()
	}()
	if err := schema.JoinMode(ctx, conn, l.layout, 0); err != nil {
		var conflict *schema.ModeConflict
		if errors.As(err, &conflict) {
			l.mu.Lock()
			l.err = err
			close(l.changed)
			l.changed = make(chan struct{})
			l.mu.Unlock()
			return err
		}
		return fmt.Errorf("take the capture mode lock: %w", err)
	}
	return l.hold(ctx, conn, standby)
}

// hold takes the lock on conn and keeps it while conn answers. It returns
// the error of a failed attempt to take the lock, and nil once it held the
// lock and the connection broke or ctx ended.
func (l *leadership) hold(ctx context.Context, conn *pgx.Conn, standby *bool) error {
	for {
		var got bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int, 0)`, l.key).Scan(&got)
		if err != nil {
			return fmt.Errorf("take the lock: %w", err)
		}
		l.down.Store(false)
		l.fails.OK()
		if got {
			break
		}
		if !*standby {
			l.log.Info("another relay captures from this outbox; standing by", "table", l.table)
			*standby = true
		}
		if wait.Sleep(ctx, standbyInterval) != nil {
			return nil
		}
	}
	*standby = false
	l.log.Info("wal capture active", "table", l.table)
	term, cancel := context.WithCancel(ctx)
	l.set(term)
	defer func() {
		cancel()
		l.set(term) // ended now: wakes the waiters, which see it is done
	}()
	for wait.Sleep(ctx, pingInterval) == nil {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err := conn.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			l.down.Store(true)
			l.log.Warn("lost the wal capture lock connection; capture stops until the lock is taken again", "err", err)
			return nil
		}
	}
	return nil
}

package wal

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/wait"
)

// standbyInterval is how often a relay that is not the leader tries to
// take over.
const standbyInterval = time.Second

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

	mu      sync.Mutex
	err     error           // a conflict that ends capture, see schema.JoinMode
	term    context.Context // ends when the lock is lost; nil while standing by
	changed chan struct{}   // closed and replaced whenever term changes
}

func newLeadership(cfg *pgx.ConnConfig, layout schema.Layout, log *slog.Logger) *leadership {
	table := layout.Outbox.String()
	h := fnv.New32a()
	h.Write([]byte("outbox-relay:wal:" + table))
	return &leadership{cfg: cfg, key: int32(h.Sum32() & 0x7fffffff), table: table, layout: layout, log: log, changed: make(chan struct{})}
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
// then starts over.
func (l *leadership) run(ctx context.Context) {
	standby := false
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("cannot connect to take the wal capture lock; retrying", "err", err)
			}
			wait.Sleep(ctx, standbyInterval)
			continue
		}
		if err := schema.JoinMode(ctx, conn, l.layout, 0); err != nil {
			var conflict *schema.ModeConflict
			if errors.As(err, &conflict) {
				l.mu.Lock()
				l.err = err
				close(l.changed)
				l.changed = make(chan struct{})
				l.mu.Unlock()
				conn.Close(context.WithoutCancel(ctx))
				return
			}
			l.log.Warn("cannot take the capture mode lock; retrying", "err", err)
			conn.Close(context.WithoutCancel(ctx))
			wait.Sleep(ctx, standbyInterval)
			continue
		}
		l.hold(ctx, conn, &standby)
		cctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		conn.Close(cctx) // releases the lock
		cancel()
	}
}

// hold takes the lock on conn and keeps it while conn answers.
func (l *leadership) hold(ctx context.Context, conn *pgx.Conn, standby *bool) {
	for {
		var got bool
		err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int, 0)`, l.key).Scan(&got)
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("cannot take the wal capture lock; retrying", "err", err)
			}
			return
		}
		if got {
			break
		}
		if !*standby {
			l.log.Info("another relay captures from this outbox; standing by", "table", l.table)
			*standby = true
		}
		if wait.Sleep(ctx, standbyInterval) != nil {
			return
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
			l.log.Warn("lost the wal capture lock connection; capture stops until the lock is taken again", "err", err)
			return
		}
	}
}

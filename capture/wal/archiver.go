package wal

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/schema"
)

// archiver archives published rows for all batches of a source, grouping
// the batches completed while an archive statement runs, or within
// archiveLinger of the runner's last statement, into the next one (group
// commit): a stream of small transactions then costs an archive statement
// and commit per archiveLinger, not one per batch, which leaves the
// database's CPU and WAL flushes to the application and saves the relay a
// round trip per batch. Archiving is off the publish path: it only delays
// the slot's confirmed position. One statement runs at a time, and a
// second one only while enough rows (a batch's worth) wait, so that a
// backlog's archives overlap. Safe for concurrent use.
type archiver struct {
	pool  *pgxpool.Pool
	query string // archives the rows whose ids are in $1
	// bySeq archives by seq values instead (an outbox whose seq column
	// exists): a short range of the seq index read once, where ids cost an
	// index descent each.
	bySeq  *schema.SeqArchive
	limit  int // the most ids in one statement
	enough int // queued ids that start a statement without lingering
	ctx    context.Context
	wg     sync.WaitGroup // the running statements
	kick   chan struct{}  // signalled when enough ids are queued

	mu      sync.Mutex
	queue   []*archiveReq
	rows    int // ids queued
	running int
	started time.Time // when a runner last took a group
}

// maxArchivers bounds the archive statements running at once: two keep
// one statement's round trip and commit overlapping the next one's work
// while a backlog drains.
const maxArchivers = 2

// archiveLinger is the least time between the starts of one runner's
// statements, unless enough ids are waiting. The first request queued
// after it starts the next statement, on the wake that brought it, so that
// a stream of small transactions costs the runner no timer of its own;
// without one the runner's timer starts it at twice archiveLinger. It
// bounds how long a published row waits for its archive, and so how many
// published events a crash publishes again.
const archiveLinger = 20 * time.Millisecond

type archiveReq struct {
	ids  []string
	seqs []int64 // the rows' seq values, parallel to ids; with bySeq
	xids []uint32
	done chan error // buffered
}

// newArchiver returns an archiver whose statements run until ctx ends,
// each archiving at most limit ids; a queue of enough ids starts a
// statement at once. With bySeq set it archives by seq values.
func newArchiver(ctx context.Context, pool *pgxpool.Pool, query string, bySeq *schema.SeqArchive, limit, enough int) *archiver {
	return &archiver{pool: pool, query: query, bySeq: bySeq, limit: limit, enough: min(enough, limit), ctx: ctx, kick: make(chan struct{}, 1)}
}

// wait waits for the running statements; cancel the archiver's context
// first.
func (a *archiver) wait() { a.wg.Wait() }

// archive archives the rows with the given ids and seq values (seqs is
// only read with bySeq), inserted by transactions xids, and returns once
// they are archived or ctx ends.
func (a *archiver) archive(ctx context.Context, ids []string, seqs []int64, xids []uint32) error {
	req := &archiveReq{ids: ids, seqs: seqs, xids: xids, done: make(chan error, 1)}
	a.mu.Lock()
	a.queue = append(a.queue, req)
	a.rows += len(ids)
	switch {
	case a.running == 0 || a.running < maxArchivers && a.rows >= a.enough:
		a.running++
		a.wg.Go(a.run)
	case a.rows >= a.enough || time.Since(a.started) >= archiveLinger:
		signal(a.kick)
	}
	a.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run archives queued requests, as many per statement as the limit allows,
// until the queue is empty, waiting archiveLinger between statements for
// more to gather unless enough are waiting.
func (a *archiver) run() {
	for {
		group, start := a.take()
		if group == nil {
			return
		}
		var ids []string
		var seqs []int64
		var xids []uint32
		for _, r := range group {
			ids = append(ids, r.ids...)
			seqs = append(seqs, r.seqs...)
			xids = append(xids, r.xids...)
		}
		err := a.exec(a.ctx, ids, seqs, xids)
		for _, r := range group {
			r.done <- err
		}
		if err := a.linger(start); err != nil {
			a.fail(err)
			return
		}
	}
}

// linger waits until a request is queued archiveLinger or more after
// start, or twice archiveLinger passed, or enough ids are queued, or the
// archiver's context ends (an error).
func (a *archiver) linger(start time.Time) error {
	if a.ready(start) {
		return a.ctx.Err()
	}
	t := time.NewTimer(2*archiveLinger - time.Since(start))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return a.ctx.Err()
		case <-a.kick:
			if a.ready(start) {
				return a.ctx.Err()
			}
		case <-a.ctx.Done():
			return a.ctx.Err()
		}
	}
}

// ready reports whether enough ids are queued to start a statement, or
// some are and archiveLinger passed since start.
func (a *archiver) ready(start time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rows >= a.enough || a.rows > 0 && time.Since(start) >= archiveLinger
}

// fail fails every queued request with err and counts the runner out.
func (a *archiver) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.queue {
		r.done <- err
	}
	a.queue, a.rows = nil, 0
	a.running--
}

// take removes the next group from the queue and returns it with the time
// it was taken, or returns nil and counts the runner out when the queue is
// empty.
func (a *archiver) take() ([]*archiveReq, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, rows := 0, 0
	for ; n < len(a.queue) && (n == 0 || rows+len(a.queue[n].ids) <= a.limit); n++ {
		rows += len(a.queue[n].ids)
	}
	if n == 0 {
		a.running--
		return nil, time.Time{}
	}
	group := a.queue[:n:n]
	a.queue = a.queue[n:]
	a.rows -= rows
	a.started = time.Now()
	return group, a.started
}

// archiveTimeout bounds one archive: its statements (each its own
// transaction) and the wait for late transactions. When it passes, the
// archive fails and its batches are captured again.
const archiveTimeout = 10 * time.Second

// exec runs the archive statement. When it archives fewer rows than ids,
// some rows were not visible yet (the walsender sends a transaction a
// moment before it becomes visible) or are gone (inserted and deleted in
// one transaction by the application): it waits until the transactions
// are visible and runs the statement again, which archives the late rows
// and finds the others gone. The statements are idempotent.
func (a *archiver) exec(ctx context.Context, ids []string, seqs []int64, xids []uint32) error {
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	query, args := a.query, []any{ids}
	if a.bySeq != nil {
		query, args = a.bySeq.Of(seqs)
	}
	tag, err := a.pool.Exec(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("archive %d rows: %w", len(ids), err)
	}
	if tag.RowsAffected() >= int64(len(ids)) {
		return nil
	}
	if err := waitVisible(ctx, a.pool, xids); err != nil {
		return err
	}
	if _, err := a.pool.Exec(ctx, query, args...); err != nil {
		return fmt.Errorf("archive %d rows: %w", len(ids), err)
	}
	return nil
}

// waitVisible waits until the transactions xids are visible to new
// snapshots. The walsender can send a transaction as soon as its commit
// record is in the WAL, a moment before the committing backend makes it
// visible; an archive statement in that moment would not see the rows and
// leave them in the outbox for good. A transaction holds the lock on its
// own id until after it became visible, so waiting for those locks to go
// is enough.
func waitVisible(ctx context.Context, pool *pgxpool.Pool, xids []uint32) error {
	if len(xids) == 0 {
		return nil
	}
	text := make([]string, len(xids))
	for i, x := range xids {
		text[i] = strconv.FormatUint(uint64(x), 10)
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		var open bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'transactionid' AND transactionid = ANY($1::text[]::xid[]))`, text).Scan(&open); err != nil {
			return fmt.Errorf("wait for committed transactions: %w", err)
		}
		if !open {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

package claim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// # Archives in claims
//
// At a steady rate of small transactions every claim and every archive was
// a transaction of its own: two commits, each a WAL flush, per claim. So a
// batch whose completion has few rows to archive or dead-letter (at most
// hashedArray) hands its statements to the next claim (folds), which runs
// them in its own transaction, on the lease connection, before it claims
// (so the claim sees the aggregates they dead-lettered, and parks them),
// and Complete returns once that transaction committed. A completion not taken by a
// claim within foldWait runs its own transaction as before: while the
// poller waits for notifications the completion wakes it up, so only a
// poller that is not claiming (stopped, or waiting for room) lets it wait
// that long; a claim slower than foldWait (a loaded database) does not,
// nor a poller back for its next claim within foldWait of the last one:
// the completions wait while the poller claims. When the claim fails, its folded completions run their own
// transactions; the claim is tried again without them when one of their
// statements timed out waiting for a lock (foldLockTimeout), else the next
// cycle claims. The rows a folded completion archives stay in flight until
// the claim committed, so no claim sees them again before; and a claim
// commits only while this relay holds the partitions' leases, as before.

// foldWait is how long a completion waits for a claim to take its
// statements once the poller stopped claiming (no claim runs or waits for
// rows to gather, see fillRows, and none ended within foldWait): the
// poller claims again at once when woken up. A completion thus waits for
// its claim as long as the poller keeps claiming, and at most twice
// foldWait after it stopped.
const foldWait = 20 * time.Millisecond

// foldLockTimeout is the lock_timeout of a claim's folded statements in
// milliseconds: an application's lock on an outbox row (a foreign key
// check's FOR KEY SHARE) must not stall claims; the completion then waits
// for it in its own transaction.
const foldLockTimeout = "50"

// errNotFolded tells a folded completion that its claim failed: it runs
// its own transaction.
var errNotFolded = errors.New("the claim holding the archive failed")

// statement is one statement of a completion, with its arguments.
type statement struct {
	sql  string
	args []any
}

// fold is a completion waiting for a claim: its statements, the elements
// of their arrays (see planMode), and where the claim reports its outcome.
type fold struct {
	stmts []statement
	n     int
	done  chan error
}

// folds are the completions waiting for a claim, and how to wake the
// poller up. Safe for concurrent use.
type folds struct {
	mu       sync.Mutex
	waiting  []*fold
	wake     context.CancelFunc // ends the poller's wait; nil when it is not waiting
	claiming atomic.Bool        // a claim runs or is about to (see polling)
	claimed  atomic.Int64       // when the last claim ended, in nanoseconds since foldEpoch
}

// foldEpoch is the origin of folds.claimed: durations since it are read on
// the monotonic clock, so a step of the wall clock does not make a claim
// seem to have ended in the future (completions then waited for a poller
// that had stopped).
var foldEpoch = time.Now()

// claimStarts records that a claim begins, or the wait right before it;
// it returns the function that records its end.
func (f *folds) claimStarts() (ends func()) {
	f.claiming.Store(true)
	return func() {
		f.claimed.Store(int64(time.Since(foldEpoch)))
		f.claiming.Store(false)
	}
}

// polling reports whether the poller keeps claiming at now: a claim runs
// or is about to, or one ended less than foldWait ago.
func (f *folds) polling(now time.Time) bool {
	return f.claiming.Load() || now.Sub(foldEpoch)-time.Duration(f.claimed.Load()) < foldWait
}

// run hands stmts, whose arrays hold n elements, to the next claim and
// returns its outcome once it committed; ok is false when no claim took
// them within foldWait or ctx ended first, or when the claim failed: then
// the caller runs them itself.
func (f *folds) run(ctx context.Context, stmts []statement, n int) (ok bool) {
	w := &fold{stmts: stmts, n: n, done: make(chan error, 1)}
	f.mu.Lock()
	f.waiting = append(f.waiting, w)
	if f.wake != nil {
		f.wake()
	}
	f.mu.Unlock()
	t := time.NewTimer(foldWait)
	defer t.Stop()
	for waiting := true; waiting; {
		select {
		case err := <-w.done:
			return err == nil
		case now := <-t.C:
			waiting = f.polling(now)
			t.Reset(foldWait)
		case <-ctx.Done():
			waiting = false
		}
	}
	f.mu.Lock()
	for i, x := range f.waiting {
		if x == w {
			f.waiting = append(f.waiting[:i], f.waiting[i+1:]...)
			f.mu.Unlock()
			return false
		}
	}
	f.mu.Unlock()
	return <-w.done == nil // a claim took it: it ends within its own bound
}

// take returns the waiting completions whose arrays hold at most n
// elements together, oldest first, and forgets them.
func (f *folds) take(n int) []*fold {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := 0
	for ; i < len(f.waiting) && f.waiting[i].n <= n; i++ {
		n -= f.waiting[i].n
	}
	out := f.waiting[:i:i]
	f.waiting = append([]*fold(nil), f.waiting[i:]...)
	return out
}

// watch records cancel as the way to end the poller's wait and reports
// true, or reports false, recording nothing, when completions are waiting
// already; watch(nil) ends the record.
func (f *folds) watch(cancel context.CancelFunc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cancel != nil && len(f.waiting) > 0 {
		return false
	}
	f.wake = cancel
	return true
}

// queueFolds adds the folded completions' statements to the claim br, with the
// lock timeout of foldLockTimeout; *failed reports whether one of them failed
// (an archive refused, a row lock waited for too long), so that the claim is
// tried again without them.
func queueFolds(br *pgx.Batch, taken []*fold, failed *bool) {
	if len(taken) == 0 {
		return
	}
	br.Queue(`SELECT set_config('lock_timeout', $1, true)`, foldLockTimeout)
	for _, w := range taken {
		for _, st := range w.stmts {
			br.Queue(st.sql, st.args...).Fn = func(r pgx.BatchResults) error {
				_, err := r.Exec()
				*failed = err != nil
				return err
			}
		}
	}
}

// settle reports the outcome of their claim to the folded completions.
func settle(taken []*fold, err error) {
	if err != nil {
		err = errNotFolded
	}
	for _, w := range taken {
		w.done <- err
	}
}

package claim_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
)

// archiveCounter counts the round trips that archive rows: those that also
// claim (folded) and those that do not.
type archiveCounter struct {
	batchCounter
	folded, alone atomic.Int64
}

func (c *archiveCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var archives, claims bool
	for _, q := range d.Batch.QueuedQueries {
		archives = archives || strings.HasPrefix(q.SQL, "DELETE FROM")
		claims = claims || strings.Contains(q.SQL, "FOR UPDATE SKIP LOCKED")
	}
	switch {
	case archives && claims:
		c.folded.Add(1)
	case archives:
		c.alone.Add(1)
	}
	return ctx
}

// poller claims from src until the test ends, completing each batch in a
// goroutine of its own as the pipeline does, delay after it was claimed
// (0: at once), and returns the channel of the completed events' ids, sent
// once Complete returned; a failed Complete fails the test.
func poller(t *testing.T, src *claim.Source, delay time.Duration) <-chan string {
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan string, 1000)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			b, err := src.Next(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				time.Sleep(delay)
				if err := b.Complete(context.Background(), capture.Outcome{Published: b.Events()}); err != nil {
					t.Error(err)
				}
				for _, id := range ids(b.Events()) {
					out <- id
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return out
}

// TestArchiveFoldedIntoClaim: while a poller claims, the completion of a
// small batch archives its rows in the next claim's transaction, not in one
// of its own, and Complete returns after that transaction committed.
func TestArchiveFoldedIntoClaim(t *testing.T) {
	counter := &archiveCounter{}
	pool := tracedPool(t, counter)
	src := newSource(t, pool, layout, 100)
	claimed := poller(t, src, 0)
	const n = 20
	for i := range n {
		insert(t, pool, "a", i)
		select {
		case <-claimed: // Complete returned: the row is archived
		case <-time.After(time.Minute):
			t.Fatalf("event %d not completed within a minute", i)
		}
		if left := count(t, pool, "outbox"); left != 0 {
			t.Fatalf("Complete returned with %d rows left in the outbox", left)
		}
	}
	if counter.folded.Load() == 0 {
		t.Fatalf("no archive was folded into a claim (%d archived in transactions of their own)", counter.alone.Load())
	}
	t.Logf("%d archives folded into claims, %d alone", counter.folded.Load(), counter.alone.Load())
}

// TestFoldedArchiveOfLockedRow: an application holds a lock on a claimed
// row (a foreign key check's FOR KEY SHARE) when its batch completes. The
// archive, folded into the next claim, must not stall the claims: other
// rows keep coming well within the claim's statement timeout (5 s), and
// the completion waits for the lock in its own transaction and archives
// the row once the lock is gone.
func TestFoldedArchiveOfLockedRow(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 100)
	a := insert(t, pool, "a", 1)
	b := next(t, src, 5*time.Second)
	if b == nil || ids(b.Events())[0] != a {
		t.Fatalf("claimed %v, want [%s]", b, a)
	}
	locker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	mustExec(t, locker, "SELECT 1 FROM outbox WHERE id = $1 FOR KEY SHARE", a)
	completed := make(chan error, 1)
	go func() { completed <- b.Complete(ctx, capture.Outcome{Published: b.Events()}) }()
	claimed := poller(t, src, 0)
	for i := range 3 {
		id := insert(t, pool, "b", i)
		start := time.Now()
		select {
		case got := <-claimed:
			if got != id {
				t.Fatalf("claimed %s, want %s", got, id)
			}
		case <-time.After(time.Minute):
			t.Fatalf("b%d not claimed within a minute", i)
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Fatalf("b%d took %v: a claim waited for the locked row's archive", i, d)
		}
	}
	select {
	case err := <-completed:
		t.Fatalf("Complete returned %v while the row is locked", err)
	default:
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-completed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Complete did not return within a minute after the lock was released")
	}
	if left := count(t, pool, "outbox"); left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}

// slowClaims is an archiveCounter whose claims take at least delay before
// they are sent, like claims on a loaded database.
type slowClaims struct {
	archiveCounter
	delay time.Duration
}

func (c *slowClaims) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "FOR UPDATE SKIP LOCKED") {
			time.Sleep(c.delay)
			break
		}
	}
	return c.archiveCounter.TraceBatchStart(ctx, conn, d)
}

// TestArchiveFoldedIntoSlowClaim: claims take longer than a completion
// waits for a claim while the poller does not claim, and each batch
// completes while the next claim runs, too late for it. The completions
// still archive in the claim after it, not in transactions of their own.
func TestArchiveFoldedIntoSlowClaim(t *testing.T) {
	counter := &slowClaims{delay: 200 * time.Millisecond}
	pool := tracedPool(t, counter)
	src := newSource(t, pool, layout, 100)
	completed := poller(t, src, 50*time.Millisecond) // the next claim has begun
	const n = 5
	for i := range n {
		insert(t, pool, "a", i)
		select {
		case <-completed:
		case <-time.After(time.Minute):
			t.Fatalf("event %d not completed within a minute", i)
		}
	}
	if left := count(t, pool, "outbox"); left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
	if alone := counter.alone.Load(); alone > 0 {
		t.Fatalf("%d of %d archives ran in transactions of their own, %d folded into claims", alone, n, counter.folded.Load())
	}
}

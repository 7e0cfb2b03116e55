package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
)

func insertSeq(t *testing.T, q schema.Querier, agg string) (string, int64) {
	t.Helper()
	id := uuid.NewString()
	var seq int64
	if err := q.QueryRow(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1, 'order', $2, 'step', '{}') RETURNING seq`, id, agg).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return id, seq
}

// steadySource returns a source past its first claim (which reads pg_locks):
// it claimed and archived one row, so the safe seq is 1 and no seq is missing.
func steadySource(t *testing.T) (*pgxpool.Pool, *claim.Source) {
	return steadySourceOn(t, setup(t, layout))
}

// steadySourceOn is steadySource on the outbox of pool.
func steadySourceOn(t *testing.T, pool *pgxpool.Pool) (*pgxpool.Pool, *claim.Source) {
	t.Helper()
	src := newSource(t, pool, layout, 100)
	insertSeq(t, pool, "warm")
	b := next(t, src, 5*time.Second)
	if b == nil {
		t.Fatal("no batch")
	}
	complete(t, b)
	return pool, src
}

// TestSteadyLateCommit: a late commit below a committed seq, in steady
// state (the relay no longer reads pg_locks on every claim).
func TestSteadyLateCommit(t *testing.T) {
	ctx := context.Background()
	pool, src := steadySource(t)
	for round := range 3 {
		slow, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, _ := insertSeq(t, slow, "a")
		second, _ := insertSeq(t, pool, "a")
		if b := next(t, src, 300*time.Millisecond); b != nil {
			t.Fatalf("round %d: claimed %v while the lower seq is open", round, ids(b.Events()))
		}
		if err := slow.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got := claimN(t, src, 2); fmt.Sprint(got) != fmt.Sprint([]string{first, second}) {
			t.Fatalf("round %d: claimed %v, want [%s %s]", round, got, first, second)
		}
	}
}

// TestSteadySavepoint: the lower seq's row is inserted in a released
// subtransaction of a still-open transaction.
func TestSteadySavepoint(t *testing.T) {
	ctx := context.Background()
	pool, src := steadySource(t)
	slow, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	mustExec(t, slow, `SAVEPOINT a`)
	first, _ := insertSeq(t, slow, "a")
	mustExec(t, slow, `RELEASE SAVEPOINT a`)
	mustExec(t, slow, `SAVEPOINT b`)
	insertSeq(t, slow, "zz")
	mustExec(t, slow, `ROLLBACK TO SAVEPOINT b`)
	second, _ := insertSeq(t, pool, "a")
	if b := next(t, src, 300*time.Millisecond); b != nil {
		t.Fatalf("claimed %v while the lower seq is open", ids(b.Events()))
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := claimN(t, src, 2); fmt.Sprint(got) != fmt.Sprint([]string{first, second}) {
		t.Fatalf("claimed %v, want [%s %s]", got, first, second)
	}
}

// claimN claims and completes batches until they held n events, within 5
// seconds, and returns their ids in claim order.
func claimN(t *testing.T, src *claim.Source, n int) []string {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(5 * time.Second); len(got) < n && time.Now().Before(deadline); {
		if b := next(t, src, time.Until(deadline)); b != nil {
			got = append(got, ids(b.Events())...)
			complete(t, b)
		}
	}
	return got
}

// TestSteadyRollbackGap measures how long a row behind a rolled-back
// seq waits in steady state.
func TestSteadyRollbackGap(t *testing.T) {
	ctx := context.Background()
	pool, src := steadySource(t)
	for round := range 5 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insertSeq(t, tx, "a")
		tx.Rollback(ctx)
		start := time.Now()
		id, _ := insertSeq(t, pool, "a")
		b := next(t, src, 5*time.Second)
		if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{id}) {
			t.Fatalf("claimed %v, want [%s]", b, id)
		}
		t.Logf("round %d: row behind a rolled-back seq claimed after %v", round, time.Since(start))
		complete(t, b)
	}
}

// TestExplicitSeqFillsNoGap: on an outbox whose seq index is not unique
// (created by hand), a row written with an explicit seq (OVERRIDING SYSTEM
// VALUE) equal to the seq an open writer drew makes the seqs look
// contiguous; the newer row of the open writer's aggregate must not be
// claimed before the writer commits. (With the unique index `relay init`
// creates, that INSERT waits for the open writer instead.)
func TestExplicitSeqFillsNoGap(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	mustExec(t, pool, `DROP INDEX outbox_relay_seq_idx`)
	mustExec(t, pool, `CREATE INDEX outbox_relay_seq_idx ON outbox (seq)`)
	pool, src := steadySourceOn(t, pool)
	w, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Rollback(ctx)
	_, s := insertSeq(t, w, "a") // open writer, seq 2
	mustExec(t, pool, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, seq)
		OVERRIDING SYSTEM VALUE VALUES (gen_random_uuid(), 'order', 'x', 'e', '{}', %d)`, s))
	newer, _ := insertSeq(t, pool, "a") // seq 3, same aggregate as the open writer
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		b := next(t, src, time.Until(deadline))
		if b == nil {
			break
		}
		for _, id := range ids(b.Events()) {
			if id == newer {
				t.Fatalf("claimed aggregate a's seq %d while its seq %d is uncommitted", s+1, s)
			}
		}
		complete(t, b)
	}
}

// TestSafeSeqCappedAtSequence: a row with an explicit seq above the
// sequence's last value H is not claimed while H is below it, although
// every seq up to it is visible; once the sequence passes it, it is.
func TestSafeSeqCappedAtSequence(t *testing.T) {
	pool, src := steadySource(t)
	id := uuid.NewString()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, seq)
		OVERRIDING SYSTEM VALUE VALUES ($1, 'order', 'x', 'e', '{}', 2)`, id)
	if b := next(t, src, 300*time.Millisecond); b != nil {
		t.Fatalf("claimed %v above the sequence's last value", ids(b.Events()))
	}
	mustExec(t, pool, `SELECT setval(pg_get_serial_sequence('outbox', 'seq'), 2)`)
	b := next(t, src, 5*time.Second)
	if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{id}) {
		t.Fatalf("claimed %v, want [%s]", b, id)
	}
	complete(t, b)
}

// TestSequenceCacheRefused: poll capture refuses a seq sequence that caches
// values per session, naming the statement that fixes it, and starts once
// it was run.
func TestSequenceCacheRefused(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	mustExec(t, pool, `ALTER TABLE outbox ALTER COLUMN seq SET CACHE 20`)
	_, err := claim.New(ctx, claim.Options{Pool: pool, Layout: layout})
	const fix = "ALTER SEQUENCE public.outbox_seq_seq CACHE 1"
	if err == nil || !strings.Contains(err.Error(), fix) || fault.ClassOf(err) != fault.Permanent {
		t.Fatalf("New with CACHE 20: %v, want a permanent error naming %q", err, fix)
	}
	mustExec(t, pool, fix)
	newSource(t, pool, layout, 10)
}

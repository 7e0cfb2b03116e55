package claim

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestReadyReleasesAsAdvance runs the ready statement with several pending
// pairs whose writers are partly ended and partly open, and then with every
// writer ended, and checks that it reads the open writers and releases the
// same safe seq as watermarks.advance does with them.
func TestReadyReleasesAsAdvance(t *testing.T) {
	ctx := context.Background()
	pool, l := outboxDB(t, nil)
	// writer inserts a row in a transaction it leaves open and returns the
	// transaction and its virtual id.
	writer := func() (pgx.Tx, string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(ctx) })
		var vx string
		if err := tx.QueryRow(ctx, `WITH i AS (INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES (gen_random_uuid(), 'order', 'a', 'step', '{}') RETURNING 1)
			SELECT virtualtransaction FROM pg_locks, i WHERE pid = pg_backend_pid() LIMIT 1`).Scan(&vx); err != nil {
			t.Fatal(err)
		}
		return tx, vx
	}
	committed, ended1 := writer()
	rolledBack, ended2 := writer()
	open1Tx, open1 := writer()
	open2Tx, open2 := writer()
	if err := committed.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rolledBack.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	marks := watermarks{safe: 5, pending: []watermark{
		{seq: 10, writers: []string{ended1, ended2}},
		{seq: 20, writers: []string{ended1, open1}},
		{seq: 15, writers: []string{ended2}},
		{seq: 30, writers: []string{open2}},
		{seq: 25, writers: []string{ended2, open1, open2}},
	}}
	// run runs safeBound with the pending pairs of w and H h, and returns the
	// open writers it read and the safe seq.
	run := func(w watermarks, h int64) ([]string, int64) {
		seqs, writers := w.flat()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT set_config('relay.h', $1::bigint::text, true), set_config('relay.safe', $2::bigint::text, true)`,
			h, w.safe); err != nil {
			t.Fatal(err)
		}
		var open []string
		var safe int64
		if err := tx.QueryRow(ctx, safeBound, l.Outbox.Ident(), seqs, writers).Scan(&open, &safe); err != nil {
			t.Fatal(err)
		}
		return open, safe
	}
	check := func(step string, h int64, wantOpen []string, wantSafe int64) {
		t.Helper()
		open, safe := run(marks, h)
		slices.Sort(open)
		slices.Sort(wantOpen)
		if !slices.Equal(open, wantOpen) {
			t.Fatalf("%s: safeBound read open writers %v, want %v", step, open, wantOpen)
		}
		marks.advance(h, open)
		if safe != wantSafe || marks.safe != wantSafe {
			t.Fatalf("%s: safeBound released up to %d, advance up to %d, want %d", step, safe, marks.safe, wantSafe)
		}
	}
	check("two writers open", 40, []string{open1, open2}, 15)
	if err := open1Tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	check("one writer open", 40, []string{open2}, 20)
	if err := open2Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	check("no writer open", 50, nil, 50)
}

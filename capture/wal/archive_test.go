package wal_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestDeadLetters dead-letters a bad row and an event whose rows exist,
// copied from the outbox, and an event whose row is gone (the application
// inserted and deleted it in one transaction), from the values received.
func TestDeadLetters(t *testing.T) {
	pool := setup(t, layout)
	src := newStreaming(t, options(t, pool, layout, 10))
	ctx := context.Background()
	bad := uuid.NewString()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, 't', 'a', 'e', '{"x": 1}', '{"n": 1}')`, bad)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone := insert(t, tx, "b", 1)
	mustExec(t, tx, `DELETE FROM outbox WHERE id = $1`, gone)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	kept := insert(t, pool, "c", 1)
	published := insert(t, pool, "d", 1)
	bs := collect(t, src, 3, 10*time.Second)
	evs := events(bs)
	if fmt.Sprint(ids(evs)) != fmt.Sprint([]string{gone, kept, published}) {
		t.Fatalf("got %v, want [%s %s %s] (the bad row is not an event)", ids(evs), gone, kept, published)
	}
	now := time.Now().UnixNano()
	dead := func(i int) capture.DeadEvent {
		return capture.DeadEvent{Event: evs[i], Err: "too big", Class: "permanent", Attempts: 3, FirstFailed: now, LastFailed: now}
	}
	for i, b := range bs {
		var o capture.Outcome
		for _, ev := range b.Events() {
			if ev.ID == published {
				o.Published = append(o.Published, ev)
			} else {
				o.Dead = append(o.Dead, dead(indexOf(evs, ev.ID)))
			}
		}
		if err := b.Complete(ctx, o); err != nil {
			t.Fatalf("complete batch %d: %v", i, err)
		}
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox", n)
	}
	rows, err := pool.Query(ctx, `SELECT id::text, aggregate_id, payload::text, coalesce(headers::text, ''), seq, error, error_class, attempts
		FROM outbox_dead_letter ORDER BY aggregate_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id, agg, payload, headers, msg, class string
		var seq int64
		var attempts int
		if err := rows.Scan(&id, &agg, &payload, &headers, &seq, &msg, &class, &attempts); err != nil {
			t.Fatal(err)
		}
		if seq == 0 {
			t.Errorf("dead letter %s has no seq", id)
		}
		got = append(got, fmt.Sprintf("%s %s %s %s %s %d", id, payload, headers, strings.SplitN(msg, ":", 2)[0], class, attempts))
	}
	want := []string{
		fmt.Sprintf(`%s {"x": 1} {"n": 1} bad row permanent 1`, bad),
		fmt.Sprintf(`%s {"step": 1, "aggregate": "b"} {"trace": "t"} too big permanent 3`, gone),
		fmt.Sprintf(`%s {"step": 1, "aggregate": "c"} {"trace": "t"} too big permanent 3`, kept),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func indexOf(evs []*event.Event, id string) int {
	for i, ev := range evs {
		if ev.ID == id {
			return i
		}
	}
	return -1
}

// TestArchiveModeMark marks published rows instead of deleting them; the
// update is not streamed.
func TestArchiveModeMark(t *testing.T) {
	pool := setup(t, layout)
	for _, stmt := range layout.ArchiveDDL(schema.ArchiveMark, nil) {
		mustExec(t, pool, stmt)
	}
	o := options(t, pool, layout, 10)
	o.ArchiveMode = schema.ArchiveMark
	src := newStreaming(t, o)
	a := insert(t, pool, "a", 1)
	complete(t, collect(t, src, 1, 10*time.Second)[0])
	var marked bool
	if err := pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL FROM outbox WHERE id = $1`, a).Scan(&marked); err != nil || !marked {
		t.Fatalf("row not marked: %v", err)
	}
	b := insert(t, pool, "a", 2)
	got := collect(t, src, 1, 10*time.Second)
	if ids(got[0].Events())[0] != b {
		t.Fatalf("got %v, want only %s", ids(got[0].Events()), b)
	}
}

// TestNewErrors shows the problems New reports as permanent, naming what
// is wrong.
func TestNewErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, sql string
		want      []string
	}{
		{"missing outbox", "", []string{"public.outbox"}},
		{"publication of another table", `CREATE TABLE other (x int); CREATE PUBLICATION relay_pub FOR TABLE other`,
			[]string{"relay_pub", "public.outbox", "ALTER PUBLICATION"}},
		{"publication with a row filter", `CREATE PUBLICATION relay_pub FOR TABLE outbox WHERE (aggregate_type = 'x')`,
			[]string{"relay_pub", "filters"}},
		{"publication without inserts", `CREATE PUBLICATION relay_pub FOR TABLE outbox WITH (publish = 'update')`,
			[]string{"relay_pub", "inserts"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pool *pgxpool.Pool
			if tc.sql == "" {
				var err error
				if pool, err = pgxpool.New(ctx, testenv.NewDB(t)); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
			} else {
				pool = setup(t, layout)
				mustExec(t, pool, tc.sql)
			}
			_, err := wal.New(ctx, options(t, pool, layout, 10))
			if err == nil || fault.ClassOf(err) != fault.Permanent {
				t.Fatalf("err = %v, want a permanent error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestSetupThenRun runs what `relay init` runs on an outbox with rows:
// the first source publishes them, then streams. It also runs the dry-run
// statements on another database, and Check on both.
func TestSetupThenRun(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	before := []string{insert(t, pool, "a", 1), insert(t, pool, "a", 2)}
	o := options(t, pool, layout, 10)
	if fs := wal.Check(ctx, pool, table.Layout(layout), o.Slot, o.Publication, false); findingErr(fs) == nil {
		t.Fatalf("check passed before setup: %v", fs)
	}
	for range 2 { // idempotent
		if err := wal.Setup(ctx, pool, table.Layout(layout), o.Slot, o.Publication, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := findingErr(wal.Check(ctx, pool, table.Layout(layout), o.Slot, o.Publication, false)); err != nil {
		t.Fatalf("check after setup: %v", err)
	}
	after := insert(t, pool, "a", 3)
	src := newSource(t, o)
	var got []string
	for len(got) < 3 { // the stream starts once the drained batches are archived
		b := next(t, src, 10*time.Second)
		if b == nil {
			t.Fatalf("got %v, then nothing", got)
		}
		got = append(got, ids(b.Events())...)
		complete(t, b)
	}
	if fmt.Sprint(got) != fmt.Sprint(append(before, after)) {
		t.Fatalf("got %v, want %v", got, append(before, after))
	}

	dry := setup(t, layout)
	slot := newSlotName()
	for _, stmt := range wal.SetupSQL(table.Layout(layout), slot, "dry_pub", false, false) {
		mustExec(t, dry, stmt)
	}
	if err := findingErr(wal.Check(ctx, dry, table.Layout(layout), slot, "dry_pub", false)); err != nil {
		t.Fatalf("check after the dry-run statements: %v", err)
	}
}

func findingErr(fs []wal.Finding) error {
	var errs []error
	for _, f := range fs {
		if f.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (fix: %s)", f.What, f.Err, f.Fix))
		}
	}
	return errors.Join(errs...)
}

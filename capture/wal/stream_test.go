package wal_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
)

// TestPayloadTypesHeadersAndRemap streams each payload type from a
// schema-qualified outbox with odd names and remapped columns.
func TestPayloadTypesHeadersAndRemap(t *testing.T) {
	for _, tc := range []struct{ typ, value, want, ct, headers string }{
		{"jsonb", `{"a": 1}`, `{"a": 1}`, event.ContentTypeJSON, `{"trace": "x"}`},
		{"json", `{"a":1,  "b":2}`, `{"a":1,  "b":2}`, event.ContentTypeJSON, ""},
		{"text", "héllo\nwörld", "héllo\nwörld", event.ContentTypeText, `{"trace": "x"}`},
		{"bytea", `\x00ff105c78`, "\x00\xff\x10\\x", event.ContentTypeBinary, ""},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			l := layout
			l.Outbox = schema.Table{Schema: "app data", Name: `Out "Box`}
			l.Cols.AggregateID = "Order Id"
			l.Cols.Payload = "body"
			l.DeadLetter = schema.Table{Schema: "app data", Name: "dead"}
			pool := setup(t, l)
			mustExec(t, pool, fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN body TYPE %s USING body::text::%s, ADD COLUMN extra int`,
				l.Outbox.Ident(), tc.typ, tc.typ))
			src := newStreaming(t, options(t, pool, l, 10))
			id := uuid.NewString()
			var headers *string
			if tc.headers != "" {
				headers = &tc.headers
			}
			created := time.Date(2024, 2, 29, 23, 59, 58, 123456000, time.FixedZone("x", 5*3600+1800))
			mustExec(t, pool, fmt.Sprintf(`INSERT INTO %s (id, aggregate_type, "Order Id", event_type, body, headers, created_at, extra)
				VALUES ($1, 't', 'o-1', 'e', $2, $3, $4, 7)`, l.Outbox.Ident()), id, tc.value, headers, created)
			b := next(t, src, 10*time.Second)
			if b == nil || len(b.Events()) != 1 {
				t.Fatalf("batch %v", b)
			}
			ev := b.Events()[0]
			if ev.ID != id || string(ev.Payload) != tc.want || ev.ContentType != tc.ct || ev.AggregateID != "o-1" ||
				ev.AggregateType != "t" || ev.EventType != "e" || !ev.CreatedAt.Equal(created) || ev.Position == 0 {
				t.Fatalf("got %+v payload %q", ev, ev.Payload)
			}
			if (tc.headers == "") != (ev.Headers == nil) || (tc.headers != "" && ev.Headers["trace"] != "x") {
				t.Fatalf("headers %v, want %q", ev.Headers, tc.headers)
			}
			complete(t, b)
			if n := count(t, pool, l.Outbox.Ident()); n != 0 {
				t.Fatalf("%d rows left after archiving", n)
			}
		})
	}
}

// TestRelationChangesMidStream alters the outbox between inserts: the
// columns move, and both rows decode.
func TestRelationChangesMidStream(t *testing.T) {
	pool := setup(t, layout)
	src := newStreaming(t, options(t, pool, layout, 10))
	first := insert(t, pool, "a", 1)
	b1 := next(t, src, 10*time.Second)
	mustExec(t, pool, `ALTER TABLE outbox DROP COLUMN headers, ADD COLUMN note text, ADD COLUMN headers jsonb`)
	second := insert(t, pool, "a", 2)
	b2 := next(t, src, 10*time.Second)
	got := events([]capture.Batch{b1, b2})
	if fmt.Sprint(ids(got)) != fmt.Sprint([]string{first, second}) {
		t.Fatalf("got %v, want [%s %s]", ids(got), first, second)
	}
	for _, ev := range got {
		if ev.Headers["trace"] != "t" || ev.AggregateID != "a" {
			t.Fatalf("bad event after relation change: %+v", ev)
		}
	}
}

// TestOnlyInsertsCount shows updates and deletes are ignored, and a row
// inserted and deleted in one transaction is still published; its archive
// is a no-op.
func TestOnlyInsertsCount(t *testing.T) {
	pool := setup(t, layout)
	src := newStreaming(t, options(t, pool, layout, 10))
	ctx := context.Background()
	a := insert(t, pool, "a", 1)
	mustExec(t, pool, `UPDATE outbox SET event_type = 'changed' WHERE id = $1`, a)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := insert(t, tx, "a", 2)
	mustExec(t, tx, `DELETE FROM outbox WHERE id = $1`, b)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `DELETE FROM outbox WHERE id = $1`, a)
	c := insert(t, pool, "a", 3)
	bs := collect(t, src, 3, 10*time.Second)
	got := events(bs)
	if fmt.Sprint(ids(got)) != fmt.Sprint([]string{a, b, c}) || got[0].EventType != "step" {
		t.Fatalf("got %v, want [%s %s %s] as inserted", ids(got), a, b, c)
	}
	for _, b := range bs {
		complete(t, b)
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left", n)
	}
}

// TestCommitOrder shows events come in commit order across concurrent
// transactions, not in insert or seq order.
func TestCommitOrder(t *testing.T) {
	pool := setup(t, layout)
	src := newStreaming(t, options(t, pool, layout, 100))
	ctx := context.Background()
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	x1 := insert(t, tx1, "x", 1)
	y1 := insert(t, tx2, "y", 1)
	x2 := insert(t, tx1, "x", 2)
	y2 := insert(t, tx2, "y", 2)
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	z := insert(t, pool, "z", 1)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := events(collect(t, src, 5, 10*time.Second))
	want := []string{y1, y2, z, x1, x2}
	if fmt.Sprint(ids(got)) != fmt.Sprint(want) {
		t.Fatalf("got %v, want commit order %v", ids(got), want)
	}
	if !(got[0].Position == got[1].Position && got[1].Position < got[2].Position && got[2].Position < got[3].Position) {
		t.Fatalf("positions are not the commit LSNs: %d %d %d %d", got[0].Position, got[1].Position, got[2].Position, got[3].Position)
	}
}

// TestConfirmedNeverPassesUnarchived completes batches out of order and
// checks the slot's confirmed position stays before the oldest unarchived
// event, then moves past all once it is archived.
func TestConfirmedNeverPassesUnarchived(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 2)
	src := newStreaming(t, o)
	var want []string
	for i := range 6 { // one transaction each; batches of 2
		want = append(want, insert(t, pool, "a", i))
	}
	bs := collect(t, src, 6, 10*time.Second)
	if got := ids(events(bs)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	start := confirmed(t, pool, o.Slot)
	first := pglogrepl.LSN(bs[0].Events()[0].Position)
	last := pglogrepl.LSN(bs[len(bs)-1].Events()[0].Position) // Events is empty once archived
	for _, b := range slices.Backward(bs[1:]) {
		complete(t, b)
	}
	for range 3 { // status updates sent after the archives report what the source confirms
		r := replyTime(t, pool, o.Slot)
		waitFor(t, 10*time.Second, "a status update", func() bool { return replyTime(t, pool, o.Slot).After(r) })
	}
	if c := confirmed(t, pool, o.Slot); c > first {
		t.Fatalf("confirmed %s passed the unarchived event at %s (start %s)", c, first, start)
	}
	complete(t, bs[0])
	waitFor(t, 5*time.Second, "the slot to confirm past every archived event", func() bool {
		return confirmed(t, pool, o.Slot) > last
	})
}

// TestRestartRedeliversUnconfirmedTail stops a source with some batches
// unarchived, one of them after an archived batch: a new one streams again,
// with the same ids, exactly the unarchived events of the unconfirmed tail,
// in every archive mode. The archived batch is replayed from the slot but
// dropped, not delivered again.
func TestRestartRedeliversUnconfirmedTail(t *testing.T) {
	for _, mode := range []string{schema.ArchiveDelete, schema.ArchiveMark, schema.ArchiveMove} {
		t.Run(mode, func(t *testing.T) {
			pool := setup(t, layout)
			for _, stmt := range layout.ArchiveDDL(mode, nil) {
				mustExec(t, pool, stmt)
			}
			o := options(t, pool, layout, 2)
			o.ArchiveMode = mode
			src := newStreaming(t, o)
			var want []string
			for i := range 10 {
				want = append(want, insert(t, pool, "a", i))
			}
			bs := collect(t, src, 10, 10*time.Second)
			head := len(bs[0].Events()) + len(bs[1].Events()) // Events is empty once archived
			archived := ids(bs[3].Events())
			tail := slices.DeleteFunc(slices.Clone(want[head:]), func(id string) bool { return slices.Contains(archived, id) })
			complete(t, bs[0])
			complete(t, bs[1])
			complete(t, bs[3]) // archived, but after an unarchived batch
			src.Close()
			o.Logger = testLog(t)
			again := newSource(t, o)
			got := ids(events(collect(t, again, len(tail), 10*time.Second)))
			if fmt.Sprint(got) != fmt.Sprint(tail) {
				t.Fatalf("redelivered %v, want the unconfirmed tail without the archived batch %v: %v", got, archived, tail)
			}
			if b := next(t, again, 500*time.Millisecond); b != nil {
				t.Fatalf("more redelivered: %v", ids(b.Events()))
			}
			if skipped := again.Replayed(); skipped != int64(len(archived)) {
				t.Fatalf("Replayed() = %d skipped; want %d", skipped, len(archived))
			}
		})
	}
}

// TestStatusKeepsConnectionWhileWindowFull holds a full batch unread for
// longer than wal_sender_timeout: status updates keep the connection.
func TestStatusKeepsConnectionWhileWindowFull(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 10)
	o.StatusInterval = time.Minute // lowered to a third of wal_sender_timeout
	o.ReplConfig = &pool.Config().ConnConfig.Config
	o.ReplConfig.RuntimeParams["wal_sender_timeout"] = "1500ms"
	src := newStreaming(t, o)
	var want []string
	for i := range 50 {
		want = append(want, insert(t, pool, "a", i))
	}
	got := ids(events(collect(t, src, 10, 10*time.Second)))
	pid := activePID(t, pool, o.Slot)
	time.Sleep(4 * time.Second) // the pipeline's window is full: Next is not called
	// The first batches may hold more than 10 events: collect the rest.
	got = append(got, ids(events(collect(t, src, len(want)-len(got), 30*time.Second)))...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if p := activePID(t, pool, o.Slot); p != pid {
		t.Fatalf("walsender changed from %d to %d: the connection was timed out", pid, p)
	}
}

func activePID(t testing.TB, q schema.Querier, slot string) int {
	t.Helper()
	var pid *int
	if err := q.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if pid == nil {
		t.Fatal("slot not active")
	}
	return *pid
}

// replyTime returns when the walsender of slot last received a status
// update, or the Unix epoch while it has received none or no walsender
// streams the slot.
func replyTime(t testing.TB, q schema.Querier, slot string) time.Time {
	t.Helper()
	var at time.Time
	if err := q.QueryRow(context.Background(), `SELECT coalesce((SELECT r.reply_time FROM pg_stat_replication r
		JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1), 'epoch')`, slot).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// TestIdleOutboxBusyDatabaseAdvancesSlot writes only to another table: the
// slot still confirms the server's WAL end, so it retains little WAL.
func TestIdleOutboxBusyDatabaseAdvancesSlot(t *testing.T) {
	pool := setup(t, layout)
	mustExec(t, pool, `CREATE TABLE other (x int)`)
	o := options(t, pool, layout, 10)
	src := newStreaming(t, o)
	ctx := context.Background()
	start := confirmed(t, pool, o.Slot)
	for range 200 {
		mustExec(t, pool, `INSERT INTO other SELECT generate_series(1, 100)`)
	}
	var end pglogrepl.LSN
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, fmt.Sprintf("the slot to advance from %s to the WAL end %s", start, end), func() bool {
		return confirmed(t, pool, o.Slot) >= end
	})
	waitFor(t, 5*time.Second, "slot health", func() bool {
		st := src.Slot()
		return st.WALStatus == "reserved" && st.LagBytes >= 0 && st.LagBytes < 1<<20
	})
}

// TestBatchBytes: one transaction of large rows streams through in batches
// that end once they hold MaxBatchBytes, a row larger than that in a batch
// of its own.
func TestBatchBytes(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 500)
	o.MaxBatchBytes = 300 << 10
	src := newStreaming(t, o)
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'a' || i, 'step', jsonb_build_object('pad', repeat('x', CASE WHEN i = 5 THEN 500000 ELSE 100000 END))
		FROM generate_series(1, 12) AS i`)
	batches := 0
	for got := 0; got < 12; batches++ {
		b := next(t, src, 30*time.Second)
		if b == nil {
			t.Fatalf("got %d of 12 events", got)
		}
		bytes := 0
		for _, ev := range b.Events() {
			if bytes >= o.MaxBatchBytes {
				t.Errorf("batch %d goes on after %d bytes", batches, bytes)
			}
			bytes += ev.Size()
		}
		got += len(b.Events())
		complete(t, b)
	}
	if batches < 4 {
		t.Errorf("12 rows of 100 KB and one of 500 KB came in %d batches, want at least 4", batches)
	}
}

// TestArchivedPositionConfirmedSoon: once a batch is archived, the slot
// confirms it soon, with no message from the server to wake the stream and
// the next periodic status update 200 s away (a third of
// wal_sender_timeout): the archive interrupts the stream's read.
func TestArchivedPositionConfirmedSoon(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 10)
	quietStatus(&o)
	src := newStreaming(t, o)
	insert(t, pool, "a", 0)
	var end pglogrepl.LSN
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	complete(t, collect(t, src, 1, 30*time.Second)[0])
	waitFor(t, 30*time.Second, fmt.Sprintf("the slot to confirm %s", end), func() bool { return confirmed(t, pool, o.Slot) >= end })
}

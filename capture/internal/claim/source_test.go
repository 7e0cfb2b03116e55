package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/outboxtest"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var layout = outboxtest.Layout()

// setup creates the outbox of layout l with its notify trigger in a fresh
// database and returns a pool on it.
func setup(t testing.TB, l schema.Layout) *pgxpool.Pool {
	t.Helper()
	pool := outboxtest.DB(t, l, nil)
	for _, s := range l.CreateNotifyTrigger() {
		mustExec(t, pool, s)
	}
	return pool
}

var mustExec = outboxtest.Exec

func newSource(t testing.TB, pool *pgxpool.Pool, l schema.Layout, batch int) *claim.Source {
	t.Helper()
	src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: l, BatchSize: batch, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func insert(t *testing.T, q schema.Querier, agg string, step int) string {
	t.Helper()
	id := uuid.NewString()
	mustExec(t, q, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', $2, 'step', $3)`,
		id, agg, fmt.Sprintf(`{"step": %d}`, step))
	return id
}

// next claims a batch, waiting at most d; it returns nil when none came.
func next(t *testing.T, src *claim.Source, d time.Duration) capture.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	b, err := src.Next(ctx)
	if err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	return b
}

func ids(evs []*event.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

func complete(t *testing.T, b capture.Batch) {
	t.Helper()
	if err := b.Complete(context.Background(), capture.Outcome{Published: b.Events()}); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, q schema.Querier, table string) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestClaimPublishArchive(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 3)
	var want []string
	for i := range 5 {
		want = append(want, insert(t, pool, "a", i))
	}
	b1 := next(t, src, 5*time.Second)
	b2 := next(t, src, 5*time.Second) // pipelined: the first claim is still open
	if b1 == nil || b2 == nil {
		t.Fatal("no batch")
	}
	got := append(ids(b1.Events()), ids(b2.Events())...)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claimed %v, want %v in seq order", got, want)
	}
	ev := b1.Events()[0]
	if ev.ContentType != event.ContentTypeJSON || string(ev.Payload) != `{"step": 0}` || ev.AggregateID != "a" || ev.CreatedAt.IsZero() {
		t.Fatalf("bad event %+v", ev)
	}
	complete(t, b2)
	if n := count(t, pool, "outbox"); n != 3 {
		t.Fatalf("outbox has %d rows after archiving 2, want 3", n)
	}
	b1.Abandon(context.Background())
	b3 := next(t, src, 5*time.Second)
	if b3 == nil || fmt.Sprint(ids(b3.Events())) != fmt.Sprint(want[:3]) {
		t.Fatalf("abandoned rows not claimed again: %v", b3)
	}
	complete(t, b3)
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("outbox has %d rows, want 0", n)
	}
}

// TestLateCommitRace reproduces the race of a transaction that drew a
// smaller seq committing after one that drew a larger seq, in both xid
// orders: the writer of the older event may have the older or the newer
// xid. The newer event must not be claimed before the older one committed.
func TestLateCommitRace(t *testing.T) {
	for _, olderXIDFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("older_xid_first=%v", olderXIDFirst), func(t *testing.T) {
			pool := setup(t, layout)
			mustExec(t, pool, `CREATE TABLE orders (id text PRIMARY KEY)`)
			src := newSource(t, pool, layout, 100)
			ctx := context.Background()
			slow, err := pool.Begin(ctx) // will hold seq 1
			if err != nil {
				t.Fatal(err)
			}
			defer slow.Rollback(ctx)
			fast, err := pool.Begin(ctx) // will hold seq 2
			if err != nil {
				t.Fatal(err)
			}
			defer fast.Rollback(ctx)
			if !olderXIDFirst {
				// fast takes its xid first through a business write,
				// so the slow writer's xid is the newer one: a filter on
				// xmin < snapshot xmin would let seq 2 through.
				mustExec(t, fast, `INSERT INTO orders VALUES ('o1')`)
			}
			first := insert(t, slow, "order-1", 1)
			second := insert(t, fast, "order-1", 2)
			if err := fast.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if b := next(t, src, 300*time.Millisecond); b != nil {
				t.Fatalf("claimed %v while seq 1 is uncommitted", ids(b.Events()))
			}
			if err := slow.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			b := next(t, src, 5*time.Second)
			if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{first, second}) {
				t.Fatalf("after commit claimed %v, want [%s %s]", b, first, second)
			}
			complete(t, b)
		})
	}
}

// TestUnrelatedLongTransactionDoesNotBlock shows the watermark only waits
// for open writers of the outbox.
func TestUnrelatedLongTransactionDoesNotBlock(t *testing.T) {
	pool := setup(t, layout)
	mustExec(t, pool, `CREATE TABLE other (x int)`)
	src := newSource(t, pool, layout, 100)
	ctx := context.Background()
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	mustExec(t, long, `INSERT INTO other VALUES (1)`)
	id := insert(t, pool, "a", 1)
	b := next(t, src, 5*time.Second)
	if b == nil || ids(b.Events())[0] != id {
		t.Fatalf("row blocked by an unrelated transaction: %v", b)
	}
	complete(t, b)
}

// TestRolledBackWriterReleases shows a writer that rolls back releases the
// rows behind it.
func TestRolledBackWriterReleases(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 100)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert(t, tx, "a", 1)
	id := insert(t, pool, "a", 2)
	if b := next(t, src, 200*time.Millisecond); b != nil {
		t.Fatalf("claimed %v behind an open writer", ids(b.Events()))
	}
	tx.Rollback(ctx)
	b := next(t, src, 5*time.Second)
	if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{id}) {
		t.Fatalf("claimed %v, want [%s]", b, id)
	}
	complete(t, b)
}

func TestPayloadTypesHeadersAndRemap(t *testing.T) {
	for _, tc := range []struct{ typ, value, want, ct string }{
		{"jsonb", `{"a": 1}`, `{"a": 1}`, event.ContentTypeJSON},
		{"json", `{"a":1,  "b":2}`, `{"a":1,  "b":2}`, event.ContentTypeJSON},
		{"text", "héllo", "héllo", event.ContentTypeText},
		{"bytea", "\\x00ff10", "\x00\xff\x10", event.ContentTypeBinary},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			l := layout
			l.Outbox = schema.Table{Schema: "app data", Name: "Out Box"}
			l.Cols.AggregateID = "order_id"
			l.Cols.Payload = "body"
			l.DeadLetter = schema.Table{Schema: "app data", Name: "dead"}
			pool := setup(t, l)
			mustExec(t, pool, fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN body TYPE %s USING body::text::%s, ADD COLUMN extra int`, l.Outbox.Ident(), tc.typ, tc.typ))
			src := newSource(t, pool, l, 10)
			id := uuid.NewString()
			mustExec(t, pool, fmt.Sprintf(`INSERT INTO %s (id, aggregate_type, order_id, event_type, body, headers) VALUES ($1, 't', 'o-1', 'e', $2, '{"trace":"x"}')`, l.Outbox.Ident()), id, tc.value)
			b := next(t, src, 5*time.Second)
			if b == nil {
				t.Fatal("no batch")
			}
			ev := b.Events()[0]
			if ev.ID != id || string(ev.Payload) != tc.want || ev.ContentType != tc.ct || ev.AggregateID != "o-1" || ev.Headers["trace"] != "x" {
				t.Fatalf("got %+v payload %q", ev, ev.Payload)
			}
			complete(t, b)
			if n := count(t, pool, l.Outbox.Ident()); n != 0 {
				t.Fatalf("%d rows left", n)
			}
		})
	}
}

func TestBadRowsGoToDeadLetter(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 10)
	good := insert(t, pool, "a", 1)
	bad := uuid.NewString()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, 't', 'a', 'e', '{}', '{"n": 1}')`, bad)
	b := next(t, src, 5*time.Second)
	if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{good}) {
		t.Fatalf("batch %v, want only the good row", b)
	}
	complete(t, b)
	var id, errText, class string
	var attempts int
	if err := pool.QueryRow(context.Background(), `SELECT id::text, error, error_class, attempts FROM outbox_dead_letter`).Scan(&id, &errText, &class, &attempts); err != nil {
		t.Fatal(err)
	}
	if id != bad || class != "permanent" || attempts != 1 || errText == "" {
		t.Fatalf("dead letter %s %q %s %d", id, errText, class, attempts)
	}
	if n := count(t, pool, "outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox", n)
	}
}

func TestDeadEventsMoveAtomically(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 10)
	insert(t, pool, "a", 1)
	insert(t, pool, "b", 1)
	b := next(t, src, 5*time.Second)
	evs := b.Events()
	now := time.Now().UnixNano()
	err := b.Complete(context.Background(), capture.Outcome{
		Published: evs[:1],
		Dead:      []capture.DeadEvent{{Event: evs[1], Err: "too big", Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var id, msg string
	if err := pool.QueryRow(context.Background(), `SELECT id::text, error FROM outbox_dead_letter`).Scan(&id, &msg); err != nil {
		t.Fatal(err)
	}
	if id != evs[1].ID || msg != "too big" || count(t, pool, "outbox") != 0 {
		t.Fatalf("dead letter %s %q, outbox %d", id, msg, count(t, pool, "outbox"))
	}
}

func TestMissingOutboxIsNamed(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = claim.New(context.Background(), claim.Options{Pool: pool, Layout: layout})
	if err == nil || !strings.Contains(err.Error(), "public.outbox") {
		t.Fatalf("err = %v, want it to name public.outbox", err)
	}
}

// TestPartitionsShared shows two sources split the partitions, never claim
// the same aggregate, and one takes over all partitions when the other
// closes.
func TestPartitionsShared(t *testing.T) {
	pool := setup(t, layout)
	a := newSource(t, pool, layout, 1000)
	b := newSource(t, pool, layout, 1000)
	for i := range 200 {
		insert(t, pool, fmt.Sprintf("agg-%d", i), 1)
	}
	aggs := func(bt capture.Batch) map[string]bool {
		m := map[string]bool{}
		for _, e := range bt.Events() {
			m[e.AggregateID] = true
		}
		return m
	}
	// Let both join and balance: the first claims of a may still hold all.
	var ba, bb capture.Batch
	deadline := time.Now().Add(15 * time.Second)
	for {
		ba, bb = next(t, a, 3*time.Second), next(t, b, 3*time.Second)
		if ba != nil && bb != nil {
			break
		}
		for _, x := range []capture.Batch{ba, bb} {
			if x != nil {
				x.Abandon(context.Background())
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the two sources did not split the partitions")
		}
	}
	ma, mb := aggs(ba), aggs(bb)
	for agg := range ma {
		if mb[agg] {
			t.Fatalf("aggregate %s claimed by both relays", agg)
		}
	}
	if len(ma)+len(mb) != 200 {
		t.Fatalf("claimed %d + %d aggregates, want 200", len(ma), len(mb))
	}
	complete(t, ba)
	bb.Abandon(context.Background())
	b.Close()
	var got int
	for deadline := time.Now().Add(15 * time.Second); got < len(mb) && time.Now().Before(deadline); {
		if x := next(t, a, 3*time.Second); x != nil {
			got += len(x.Events())
			complete(t, x)
		}
	}
	if got != len(mb) {
		t.Fatalf("after the other relay closed, claimed %d of its %d rows", got, len(mb))
	}
}

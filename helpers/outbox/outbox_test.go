package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/relay/helpers/internal/pgtest"
	"github.com/outboxrelay/relay/helpers/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// row is an outbox row read back, payload and headers as text.
type row struct {
	ID, AggregateType, AggregateID, EventType, Payload string
	Headers                                            *string
	CreatedAt                                          time.Time
}

// setup returns a pool on a new database where the statements ran, and the
// database's DSN.
func setup(t *testing.T, stmts ...string) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := pgtest.NewDB(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, s := range stmts {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return pool, dsn
}

// rows returns the contract outbox's rows in seq order.
func rows(t *testing.T, pool *pgxpool.Pool) []row {
	t.Helper()
	r, err := pool.Query(context.Background(), `SELECT id::text, aggregate_type, aggregate_id, event_type,
		payload::text, headers::text, created_at FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(r, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

type order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

func TestWriteCommits(t *testing.T) {
	ctx := context.Background()
	pool, _ := setup(t, outbox.DDL)
	explicit := uuid.MustParse("0190a5b4-1c2d-7e3f-8a4b-5c6d7e8f9a0b")

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o-1",
		EventType: "order.created", Payload: order{ID: "o-1", Total: 42},
		Headers: map[string]string{"trace_id": "abc", "tenant": "t1"}})
	if err != nil {
		t.Fatal(err)
	}
	many, err := outbox.WriteMany(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", Payload: []byte(`{"paid":true}`)},
		outbox.Event{AggregateType: "order", AggregateID: "o-2", EventType: "order.created", Payload: json.RawMessage(`{"id": "o-2"}`)},
		outbox.Event{AggregateType: "order", AggregateID: "o-2", EventType: "order.noted", Payload: "a string", ID: explicit},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	ids := append([]string{first}, many...)
	got := rows(t, pool)
	if len(got) != 4 {
		t.Fatalf("got %d rows, want 4: %+v", len(got), got)
	}
	headers := `{"tenant": "t1", "trace_id": "abc"}`
	want := []row{
		{ID: ids[0], AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: `{"id": "o-1", "total": 42}`, Headers: &headers},
		{ID: ids[1], AggregateType: "order", AggregateID: "o-1", EventType: "order.paid", Payload: `{"paid": true}`},
		{ID: ids[2], AggregateType: "order", AggregateID: "o-2", EventType: "order.created", Payload: `{"id": "o-2"}`},
		{ID: explicit.String(), AggregateType: "order", AggregateID: "o-2", EventType: "order.noted", Payload: `"a string"`},
	}
	for i, w := range want {
		g := got[i]
		if g.CreatedAt.IsZero() {
			t.Errorf("row %d: created_at not set", i)
		}
		g.CreatedAt = time.Time{}
		if g.ID != w.ID || g.AggregateType != w.AggregateType || g.AggregateID != w.AggregateID ||
			g.EventType != w.EventType || g.Payload != w.Payload || !equalPtr(g.Headers, w.Headers) {
			t.Errorf("row %d = %s, want %s", i, show(g), show(w))
		}
	}
	checkV7Ordered(t, ids[:3])
}

func equalPtr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func show(r row) string {
	h := "NULL"
	if r.Headers != nil {
		h = *r.Headers
	}
	return strings.Join([]string{r.ID, r.AggregateType, r.AggregateID, r.EventType, r.Payload, h}, " | ")
}

// checkV7Ordered checks that ids are UUIDv7 in strictly increasing order.
func checkV7Ordered(t *testing.T, ids []string) {
	t.Helper()
	for i, s := range ids {
		id := uuid.MustParse(s)
		if id.Version() != 7 {
			t.Errorf("id %s is version %d, want 7", s, id.Version())
		}
		if i > 0 && s <= ids[i-1] {
			t.Errorf("id %s does not sort after %s", s, ids[i-1])
		}
	}
}

func TestWriteIDsAreTimeOrdered(t *testing.T) {
	ctx := context.Background()
	pool, _ := setup(t, outbox.DDL)
	var ids []string
	for i := range 200 {
		e := outbox.Event{AggregateType: "a", AggregateID: "x", EventType: "e", Payload: map[string]int{"i": i}}
		id, err := outbox.Write(ctx, pool, e)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	batch := make([]outbox.Event, 300)
	for i := range batch {
		batch[i] = outbox.Event{AggregateType: "a", AggregateID: "y", EventType: "e", Payload: []byte(`{}`)}
	}
	more, err := outbox.WriteMany(ctx, pool, batch...)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, more...)
	checkV7Ordered(t, ids)
	// Ids sort like seq: uuid order is insertion order.
	if bySeq := texts(t, pool, `SELECT id::text FROM outbox ORDER BY seq`); !slices.Equal(bySeq, ids) {
		t.Error("ids in seq order differ from the ids Write and WriteMany returned")
	}
	if byID := texts(t, pool, `SELECT id::text FROM outbox ORDER BY id`); !slices.Equal(byID, ids) {
		t.Error("ORDER BY id differs from ORDER BY seq")
	}
}

// texts returns the single text column of query's rows.
func texts(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	r, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestWriteRollsBack(t *testing.T) {
	ctx := context.Background()
	pool, _ := setup(t, outbox.DDL)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created", Payload: order{ID: "o-1"}}
	if _, err := outbox.Write(ctx, tx, e); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.WriteMany(ctx, tx, e, e); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, pool); len(got) != 0 {
		t.Errorf("rolled back, yet %d rows: %+v", len(got), got)
	}
}

// TestWriteManyIsAtomic checks that a failing batch writes no event.
func TestWriteManyIsAtomic(t *testing.T) {
	ctx := context.Background()
	pool, _ := setup(t, outbox.DDL)
	dup := uuid.Must(uuid.NewV7())
	_, err := outbox.WriteMany(ctx, pool,
		outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "a", AggregateID: "2", EventType: "e", Payload: []byte(`{}`), ID: dup},
		outbox.Event{AggregateType: "a", AggregateID: "3", EventType: "e", Payload: []byte(`{}`), ID: dup},
	)
	if err == nil || !strings.Contains(err.Error(), `"public"."outbox"`) {
		t.Fatalf("duplicate id: err = %v, want a primary key violation naming the table", err)
	}
	if got := rows(t, pool); len(got) != 0 {
		t.Errorf("failed batch left %d rows", len(got))
	}
}

func TestRemappedTable(t *testing.T) {
	ctx := context.Background()
	pool, _ := setup(t, `CREATE SCHEMA "App Data"`, `CREATE TABLE "App Data"."order ""events""" (
		event_id  uuid PRIMARY KEY,
		topic     text NOT NULL,
		order_id  text NOT NULL,
		kind      text NOT NULL,
		body      jsonb NOT NULL,
		meta      jsonb,
		note      text,
		inserted  timestamptz NOT NULL DEFAULT now(),
		position  bigint GENERATED ALWAYS AS IDENTITY)`)
	tbl, err := outbox.New(outbox.Options{Table: `App Data.order "events"`, Columns: map[string]string{
		"id": "event_id", "aggregate_type": "topic", "aggregate_id": "order_id", "event_type": "kind",
		"payload": "body", "headers": "meta", "created_at": "inserted", "seq": "position",
	}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tbl.WriteMany(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "o-9", EventType: "created", Payload: order{ID: "o-9"},
			Headers: map[string]string{"k": "v"}},
		outbox.Event{AggregateType: "order", AggregateID: "o-9", EventType: "paid", Payload: []byte(`[1]`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := texts(t, pool, `SELECT event_id::text || ' ' || topic || ' ' || order_id || ' ' || kind || ' ' ||
		body::text || ' ' || coalesce(meta::text, 'NULL') FROM "App Data"."order ""events""" ORDER BY position`)
	want := []string{
		ids[0] + ` order o-9 created {"id": "o-9", "total": 0} {"k": "v"}`,
		ids[1] + ` order o-9 paid [1] NULL`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%q\nwant\n%q", got, want)
	}
}

// TestPayloadColumnTypes writes to payload columns of every type the
// contract allows, with every pgx query mode and with database/sql.
func TestPayloadColumnTypes(t *testing.T) {
	ctx := context.Background()
	raw := `{"s": "a\\nb \u00e9 \\\\ \"q\""}`
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, typ := range []string{"jsonb", "json", "text", "bytea"} {
		t.Run(typ, func(t *testing.T) {
			pool, dsn := setup(t, strings.Replace(outbox.DDL, "payload        jsonb", "payload "+typ, 1))
			tbl, err := outbox.New(outbox.Options{BinaryPayload: typ == "bytea"})
			if err != nil {
				t.Fatal(err)
			}
			e := outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e", Payload: []byte(raw)}
			for _, m := range modes {
				if _, err := tbl.Write(ctx, modePool(t, dsn, m), e); err != nil {
					t.Fatalf("%v: %v", m, err)
				}
			}
			e.Payload = json.RawMessage(raw)
			if _, err := tbl.Write(ctx, outbox.SQL(openSQL(t, dsn)), e); err != nil {
				t.Fatalf("database/sql: %v", err)
			}
			query := `SELECT convert_to(payload::text, 'UTF8') FROM outbox ORDER BY seq`
			if typ == "bytea" {
				query = `SELECT payload FROM outbox ORDER BY seq`
			}
			r, err := pool.Query(ctx, query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := pgx.CollectRows(r, pgx.RowTo[[]byte])
			if err != nil {
				t.Fatal(err)
			}
			want := raw
			if typ == "jsonb" {
				want = `{"s": "a\\nb é \\\\ \"q\""}` // jsonb's normal form
			}
			for i, g := range got {
				if string(g) != want {
					t.Errorf("row %d: payload %s, want %s", i, g, want)
				}
			}
		})
	}
}

// modePool returns a pool on dsn with query mode m.
func modePool(t *testing.T, dsn string, m pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = m
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func openSQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestDatabaseSQL(t *testing.T) {
	ctx := context.Background()
	pool, dsn := setup(t, outbox.DDL)
	db := openSQL(t, dsn)
	e := outbox.Event{AggregateType: "order", AggregateID: "o-1", EventType: "order.created",
		Payload: order{ID: "o-1", Total: 7}, Headers: map[string]string{"h": "1"}}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Write(ctx, outbox.SQL(tx), e); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, pool); len(got) != 0 {
		t.Fatalf("rolled back, yet %d rows", len(got))
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.Write(ctx, outbox.SQL(tx), e)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := outbox.WriteMany(ctx, outbox.SQL(tx), e, e)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := rows(t, pool)
	if len(got) != 3 {
		t.Fatalf("got %d rows, want 3", len(got))
	}
	ids = append([]string{id}, ids...)
	for i, g := range got {
		if g.ID != ids[i] || g.Payload != `{"id": "o-1", "total": 7}` || g.Headers == nil || *g.Headers != `{"h": "1"}` {
			t.Errorf("row %d = %s", i, show(g))
		}
	}
	checkV7Ordered(t, ids)
}

// failExecer fails the test if a statement is executed.
type failExecer struct{ *testing.T }

func (f failExecer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	f.Error("statement executed")
	return pgconn.CommandTag{}, nil
}

func TestValidation(t *testing.T) {
	ctx := context.Background()
	ok := outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e", Payload: []byte(`{}`)}
	tests := []struct {
		name string
		edit func(*outbox.Event)
		want string
	}{
		{"aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "empty aggregate type"},
		{"aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "empty aggregate id"},
		{"event type", func(e *outbox.Event) { e.EventType = "" }, "empty event type"},
		{"header key", func(e *outbox.Event) { e.Headers = map[string]string{"a": "1", "": "2"} }, "header with an empty key"},
		{"nil payload", func(e *outbox.Event) { e.Payload = nil }, "nil payload"},
		{"nil bytes", func(e *outbox.Event) { e.Payload = []byte(nil) }, "nil payload"},
		{"nil raw", func(e *outbox.Event) { e.Payload = json.RawMessage(nil) }, "nil payload"},
		{"unmarshallable", func(e *outbox.Event) { e.Payload = make(chan int) }, "marshal payload: json: unsupported type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := ok
			tc.edit(&bad)
			_, err := outbox.WriteMany(ctx, failExecer{t}, ok, bad)
			if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "event 1: invalid event: "+tc.want) {
				t.Errorf("err = %v, want ErrInvalidEvent: event 1: %s", err, tc.want)
			}
		})
	}
	if ids, err := outbox.WriteMany(ctx, failExecer{t}); ids != nil || err != nil {
		t.Errorf("no events: %v, %v", ids, err)
	}
	big := make([]outbox.Event, outbox.MaxBatch+1)
	if _, err := outbox.WriteMany(ctx, failExecer{t}, big...); err == nil || !strings.Contains(err.Error(), "MaxBatch") {
		t.Errorf("too many events: err = %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		o    outbox.Options
		want string
	}{
		{outbox.Options{Table: ".outbox"}, `table ".outbox": want name or schema.name`},
		{outbox.Options{Table: "app."}, `table "app.": want name or schema.name`},
		{outbox.Options{Columns: map[string]string{"kind": "type"}}, `unknown column "kind"`},
		{outbox.Options{Columns: map[string]string{"seq": ""}}, `empty column name for "seq"`},
	} {
		if _, err := outbox.New(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) err = %v, want %q", tc.o, err, tc.want)
		}
	}
}

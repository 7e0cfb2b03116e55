package claim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestScannerAsPgx claims, from tables of every column type the scanner
// reads from raw values, rows of every input class: ids canonical, upper
// case, braced, as URNs, without hyphens, invalid and NULL; empty,
// multibyte and NULL strings; headers NULL, empty, with escapes, with
// duplicate keys, with non-string values and not an object; payloads
// empty, NULL and of every type; created_at NULL and infinite; with and
// without an order column. Each claim is read twice, by the scanner and
// by scanAll, a pgx scan of every column, and the events and bad rows
// must be the same.
func TestScannerAsPgx(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const id = "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"
	classes := []struct{ id, aggType, aggID, evType, payload, headers, created string }{
		{id, "'order'", "'42'", "'created'", `'{"a": 1}'`, `'{"trace": "x", "q": "a\"b\\c", "u": "\u00e9"}'`, "now()"},
		{"upper(" + id + ")", "'Ordér'", "'日本'", "'e'", `'{}'`, "NULL", "NULL"},
		{"'{' || " + id + " || '}'", "''", "''", "''", `'[1, 2]'`, `'{}'`, "'infinity'"},
		{"'urn:uuid:' || " + id, "'t'", "'a'", "'e'", `'"s"'`, `'{"a": "1", "a": "2"}'`, "'-infinity'"},
		{"replace(" + id + ", '-', '')", "'t'", "'a'", "'e'", `'1'`, `'{"n": 1}'`, "now()"},
		{"'not-a-uuid'", "'t'", "'a'", "'e'", `'{}'`, "NULL", "now()"},
		{"NULL", "'t'", "'a'", "'e'", `'{}'`, "NULL", "now()"},
		{id, "NULL", "'a'", "'e'", `'{}'`, "NULL", "now()"},
		{id, "'t'", "NULL", "'e'", `'{}'`, "NULL", "now()"},
		{id, "'t'", "'a'", "NULL", `'{}'`, "NULL", "now()"},
		{id, "'t'", "'a'", "'e'", "NULL", "NULL", "now()"},
		{id, "'t'", "'a'", "'e'", `'{}'`, `'[]'`, "now()"},
		{id, "'t'", "'a'", "'e'", `'{}'`, `'{"nested": {"x": "y"}}'`, "'0500-06-01 12:00:00+00'"},
	}
	for _, payloadType := range []string{"jsonb", "json", "text", "varchar", "bytea"} {
		for _, headersType := range []string{"jsonb", "json"} {
			name := payloadType + "_" + headersType
			t.Run(name, func(t *testing.T) {
				table := "scan_" + name
				mustExecIn(t, conn, fmt.Sprintf(`CREATE TABLE %s (id text, aggregate_type text, aggregate_id varchar, event_type text,
					payload %s, headers %s, created_at timestamptz, seq bigint, tenant int)`, table, payloadType, headersType))
				payloads := []string{}
				if payloadType != "jsonb" && payloadType != "json" {
					payloads = append(payloads, "''") // an empty payload, first and later
				}
				for i, c := range classes {
					p := c.payload
					if i < len(payloads) {
						p = payloads[i]
					}
					if i == len(classes)-1 && len(payloads) > 0 {
						p = payloads[0]
					}
					if payloadType == "bytea" && p != "NULL" {
						p = "convert_to(" + p + ", 'UTF8')"
					}
					mustExecIn(t, conn, fmt.Sprintf(`INSERT INTO %s VALUES (%s, %s, %s, %s, %s, %s, %s, %d, %d)`,
						table, c.id, c.aggType, c.aggID, c.evType, p, c.headers, c.created, i+1, i%3))
				}
				for _, order := range []string{"", ", tenant::text"} {
					query := fmt.Sprintf("SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq%s FROM %s ORDER BY seq", order, table)
					fast := claimRows(t, conn, query, false)
					lib := claimRows(t, conn, query, true)
					if !fast.sc.fast {
						t.Fatalf("%s: the scanner does not read these columns from raw values", query)
					}
					if got, want := describe(fast), describe(lib); !reflect.DeepEqual(got, want) {
						t.Errorf("%s:\nscanner: %s\npgx:     %s", query, strings.Join(got, "\n         "), strings.Join(want, "\n         "))
					}
				}
			})
		}
	}
}

// claimRows reads every row of query into a batch, with the scanner or,
// when pgxOnly, with scanAll.
func claimRows(t testing.TB, conn *pgx.Conn, query string, pgxOnly bool) *batch {
	t.Helper()
	rows, err := conn.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	b := &batch{s: &Source{log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	for rows.Next() {
		scan := b.scan
		if pgxOnly {
			scan = b.scanAll
		}
		if err := scan(rows, "application/json"); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b
}

// describe lists a batch's events and bad rows with every field, a nil
// payload apart from an empty one.
func describe(b *batch) []string {
	var out []string
	show := func(what string, ev *event.Event) string {
		return fmt.Sprintf("%s id=%q type=%q agg=%q event=%q order=%q payload=%q nil=%v headers=%v created=%v pos=%d ct=%q",
			what, ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, ev.OrderKey, ev.Payload, ev.Payload == nil,
			ev.Headers, ev.CreatedAt.UTC(), ev.Position, ev.ContentType)
	}
	for _, ev := range b.events {
		out = append(out, show("event", ev))
	}
	for _, d := range b.bad {
		out = append(out, "bad "+d.Err)
	}
	return append(out, fmt.Sprint("seqs ", b.seqs))
}

// BenchmarkScan reads claims of 500 rows (200-byte jsonb payloads, one
// header, the outbox's column types) with the scanner and with scanAll, a
// pgx scan of every column: one op is one claim's rows read into a batch,
// the query's round trip included; allocs/row and ns/row divide by the
// rows.
func BenchmarkScan(b *testing.B) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	const rows = 500
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE outbox AS
		SELECT gen_random_uuid()::text AS id, 'order'::text AS aggregate_type, (i %% 100)::text AS aggregate_id,
		       'created'::text AS event_type, jsonb_build_object('pad', repeat('x', 188)) AS payload,
		       '{"trace": "t"}'::jsonb AS headers, now() AS created_at, i::bigint AS seq
		  FROM generate_series(1, %d) i`, rows)); err != nil {
		b.Fatal(err)
	}
	for _, pgxOnly := range []bool{false, true} {
		name := "scanner"
		if pgxOnly {
			name = "pgx"
		}
		b.Run(name, func(b *testing.B) {
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			for b.Loop() {
				claimRows(b, conn, "SELECT * FROM outbox ORDER BY seq", pgxOnly)
			}
			runtime.ReadMemStats(&m1)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/row")
			b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(b.N*rows), "allocs/row")
		})
	}
}

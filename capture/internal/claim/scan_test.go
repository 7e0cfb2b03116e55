package claim_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
)

// TestScanColumnTypes claims rows whose strings come as text, varchar and
// (for aggregate_type) char columns, with an id in upper case in a text
// column and headers with and without escapes: every event carries the
// canonical id, the strings and headers as stored.
func TestScanColumnTypes(t *testing.T) {
	for _, tc := range []struct{ name, alter string }{
		{"text", ""},
		{"varchar", `ALTER TABLE outbox ALTER COLUMN aggregate_type TYPE varchar(50), ALTER COLUMN event_type TYPE varchar,
			ALTER COLUMN id TYPE text`},
		{"char aggregate_type, json headers", `ALTER TABLE outbox ALTER COLUMN aggregate_type TYPE char(5),
			ALTER COLUMN headers TYPE json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := setup(t, layout)
			if tc.alter != "" {
				mustExec(t, pool, tc.alter)
			}
			src := newSource(t, pool, layout, 10)
			agg := uuid.NewString()
			type row struct{ id, headers string }
			rows := []row{
				{uuid.NewString(), `{"trace": "x", "b": "é"}`},
				{strings.ToUpper(uuid.NewString()), `{"q": "a\"b\\c", "u": "\u00e9"}`},
				{uuid.NewString(), ``},
			}
			if tc.name != "varchar" {
				rows[1].id = strings.ToLower(rows[1].id) // a uuid column prints lower case
			}
			for i, r := range rows {
				var h any
				if r.headers != "" {
					h = r.headers
				}
				mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
					VALUES ($1, 'Order', $2, $3, $4, $5)`, r.id, agg, fmt.Sprintf("type-%d", i), fmt.Sprintf(`{"n": %d}`, i), h)
			}
			b := next(t, src, 5*time.Second)
			if b == nil || len(b.Events()) != len(rows) {
				t.Fatalf("batch %v, want %d events", b, len(rows))
			}
			wantHeaders := []map[string]string{{"trace": "x", "b": "é"}, {"q": `a"b\c`, "u": "é"}, nil}
			for i, ev := range b.Events() {
				if ev.ID != strings.ToLower(rows[i].id) || ev.AggregateType != "Order" || ev.AggregateID != agg ||
					ev.EventType != fmt.Sprintf("type-%d", i) || string(ev.Payload) != fmt.Sprintf(`{"n": %d}`, i) ||
					ev.CreatedAt.IsZero() || fmt.Sprint(ev.Headers) != fmt.Sprint(wantHeaders[i]) {
					t.Errorf("event %d: %+v, payload %s", i, ev, ev.Payload)
				}
			}
			complete(t, b)
		})
	}
}

// TestEmptyPayloadPublished claims rows of text, varchar and bytea payloads
// whose first row, and a later one, hold an empty payload: every row is an
// event with an empty payload that is not NULL, and none is dead-lettered.
func TestEmptyPayloadPublished(t *testing.T) {
	for _, typ := range []string{"text", "varchar", "bytea"} {
		t.Run(typ, func(t *testing.T) {
			pool := setup(t, layout)
			mustExec(t, pool, fmt.Sprintf(`ALTER TABLE outbox ALTER COLUMN payload TYPE %s USING payload::text::%s`, typ, typ))
			src := newSource(t, pool, layout, 10)
			want := []string{"", "x", "", "yz"}
			mustExec(t, pool, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				SELECT gen_random_uuid(), 't', 'a', 'e', p::%s FROM unnest($1::text[]) WITH ORDINALITY AS u(p, n) ORDER BY n`, typ), want)
			b := next(t, src, 5*time.Second)
			if b == nil {
				t.Fatal("no batch")
			}
			if len(b.Events()) != len(want) {
				t.Fatalf("%d events, want %d", len(b.Events()), len(want))
			}
			for i, ev := range b.Events() {
				if ev.Payload == nil || string(ev.Payload) != want[i] {
					t.Errorf("event %d: payload %q (nil %v), want %q", i, ev.Payload, ev.Payload == nil, want[i])
				}
			}
			complete(t, b)
			if n, dead := count(t, pool, "outbox"), count(t, pool, "outbox_dead_letter"); n != 0 || dead != 0 {
				t.Fatalf("%d rows left in the outbox, %d dead-lettered", n, dead)
			}
		})
	}
}

// BenchmarkClaim drains a backlog of 500-row batches of 200-byte jsonb
// payloads with one header, as relaybench's poll drain does: one op is one
// row, claimed and archived. The backlog is inserted and analyzed in parts
// of at most 100,000 rows with the timer stopped. pg-cpu-ns/op is the CPU
// time of the database's backends per row, read from /proc, cpu-ns/op the
// CPU time of this process per row.
func BenchmarkClaim(b *testing.B) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	pool := setup(b, layout)
	src := newSource(b, pool, layout, 500)
	ctx := context.Background()
	payload := fmt.Sprintf(`{"pad": "%s"}`, strings.Repeat("x", 188))
	var pgCPU, cpu time.Duration
	b.ReportAllocs()
	b.StopTimer()
	for done := 0; done < b.N; {
		n := min(100000, b.N-done)
		mustExec(b, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			SELECT gen_random_uuid(), 'order', 'agg-' || (i % 10000), 'created', $1::jsonb, '{"source":"relaybench"}'
			FROM generate_series(1, $2) AS i`, payload, n)
		mustExec(b, pool, `VACUUM ANALYZE outbox`)
		pg0, cpu0 := backendCPU(b, pool), processCPU(b)
		b.StartTimer()
		for got := 0; got < n; {
			batch, err := src.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := batch.Complete(ctx, capture.Outcome{Published: batch.Events()}); err != nil {
				b.Fatal(err)
			}
			got += len(batch.Events())
		}
		b.StopTimer()
		cpu += processCPU(b) - cpu0
		pgCPU += backendCPU(b, pool) - pg0
		done += n
	}
	b.ReportMetric(float64(pgCPU.Nanoseconds())/float64(b.N), "pg-cpu-ns/op")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU returns the CPU time this process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// backendCPU returns the CPU time the backends of the pool's database have
// used so far, from /proc (the cluster runs on this machine).
func backendCPU(b *testing.B, pool *pgxpool.Pool) time.Duration {
	b.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	return pidsCPU(pids)
}

// pidsCPU returns the CPU time the processes pids have used so far, from
// /proc; a process that ended counts nothing.
func pidsCPU(pids []int32) time.Duration {
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // the backend ended
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100
}

package claim_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/internal/testenv"
)

// steadyRate is the rate of BenchmarkSteadyCost's single-row transactions
// per second, and steadyWriters how many connections commit them.
const (
	steadyRate    = 2000
	steadyWriters = 8
)

// BenchmarkSteadyCost relays a steady stream of single-row transactions
// (steadyRate a second from steadyWriters connections, one op per event)
// through a source whose batches are completed as the pipeline does, each
// in a goroutine of its own, on a cluster of its own with
// pg_stat_statements. It reports per event what the relay costs the
// database: relay-pg-cpu-ns (the CPU time of the relay's backends, from
// /proc), all-pg-cpu-ns (every backend of the database, the writers' too),
// wal-bytes (all of the cluster's), relay-xacts (transactions of the
// relay's sessions), relay-stmts (statements they ran), plan-ns and exec-ns
// (their planning and execution time, from pg_stat_statements), and
// cpu-ns, this process's CPU time. Run it with -benchtime=20000x (10 s).
func BenchmarkSteadyCost(b *testing.B) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on",
		"shared_buffers": "256MB", "autovacuum_naptime": "1s"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pg.Stop() })
	admin := costPool(b, pg.DSN("postgres"), "bench")
	mustExec(b, admin, `CREATE EXTENSION pg_stat_statements`)
	relay := costPool(b, pg.DSN("postgres"), "relay")
	writers := costPool(b, pg.DSN("postgres"), "writer")
	mustExec(b, admin, layout.CreateOutbox())
	mustExec(b, admin, layout.CreatePollIndex())
	src := newSource(b, relay, layout, 500)

	var done atomic.Int64
	var completions sync.WaitGroup
	relayed := make(chan error, 1)
	cctx, stop := context.WithCancel(ctx)
	go func() {
		for done.Load() < int64(b.N)+1 {
			batch, err := src.Next(cctx)
			if err != nil {
				relayed <- err
				return
			}
			completions.Go(func() {
				if err := batch.Complete(ctx, capture.Outcome{Published: batch.Events()}); err != nil {
					b.Error(err)
				}
				done.Add(int64(len(batch.Events())))
			})
		}
		relayed <- nil
	}()
	insertRow := func(q *pgxpool.Pool) error {
		_, err := q.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', $2, 'created', '{"amount": 1999, "currency": "EUR"}')`, uuid.NewString(), fmt.Sprint(time.Now().UnixNano()%5000))
		return err
	}
	if err := insertRow(writers); err != nil { // the first claim reads pg_locks
		b.Fatal(err)
	}
	for done.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	mustExec(b, admin, `SELECT pg_stat_statements_reset()`)
	before := costSnapshot(b, admin)
	cpu0 := processCPU(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range steadyWriters {
		wg.Go(func() {
			for i := w; i < b.N; i += steadyWriters {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / steadyRate)))
				if err := insertRow(writers); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(time.Minute); done.Load() < int64(b.N)+1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d events relayed", done.Load()-1, b.N)
		}
	}
	stop()
	if err := <-relayed; err != nil && cctx.Err() == nil {
		b.Fatal(err)
	}
	completions.Wait()
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	after := costSnapshot(b, admin)
	n := float64(b.N)
	b.ReportMetric(float64(after.relayCPU-before.relayCPU)/n, "relay-pg-cpu-ns/op")
	b.ReportMetric(float64(after.allCPU-before.allCPU)/n, "all-pg-cpu-ns/op")
	b.ReportMetric(float64(after.wal-before.wal)/n, "wal-bytes/op")
	b.ReportMetric(float64(after.relayXacts-before.relayXacts)/n, "relay-xacts/op")
	b.ReportMetric(float64(after.stmts)/n, "relay-stmts/op")
	b.ReportMetric(after.planMs*1e6/n, "plan-ns/op")
	b.ReportMetric(after.execMs*1e6/n, "exec-ns/op")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/op")
	if testing.Verbose() {
		rows, err := admin.Query(ctx, `SELECT calls, rows, round(total_plan_time::numeric, 1), round(total_exec_time::numeric, 1), wal_bytes, left(regexp_replace(query, '\s+', ' ', 'g'), 90)
			FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO outbox%' ORDER BY total_plan_time + total_exec_time DESC LIMIT 12`)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var calls, n, wal int64
			var plan, exec float64
			var q string
			if err := rows.Scan(&calls, &n, &plan, &exec, &wal, &q); err != nil {
				b.Fatal(err)
			}
			b.Logf("%7d calls %7d rows %8.1f ms plan %8.1f ms exec %9d WAL B  %s", calls, n, plan, exec, wal, q)
		}
	}
}

// costPool returns a pool on dsn whose sessions are named app.
func costPool(b *testing.B, dsn, app string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// costCounters are the database's counters BenchmarkSteadyCost reports.
type costCounters struct {
	relayCPU, allCPU       time.Duration
	wal, relayXacts, stmts int64
	planMs, execMs         float64
}

// costSnapshot reads the counters: the relay's sessions are those named
// relay (the source opens its lease connection with the pool's settings),
// its transactions the statements each of them begins with (txLimits), its
// statements all but the writers' INSERTs (pg_stat_statements counts
// neither BEGIN nor COMMIT sent in a pipeline).
func costSnapshot(b *testing.B, admin *pgxpool.Pool) costCounters {
	b.Helper()
	var c costCounters
	var relayPids, allPids []int32
	err := admin.QueryRow(context.Background(), `SELECT
		(SELECT array_agg(pid) FROM pg_stat_activity WHERE application_name = 'relay'),
		(SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = current_database()),
		pg_current_wal_lsn() - '0/0',
		(SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE 'SELECT set_config(''statement_timeout''%'),
		(SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO outbox%'),
		(SELECT coalesce(sum(total_plan_time), 0) FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO outbox%'),
		(SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements WHERE query NOT LIKE 'INSERT INTO outbox%')`).
		Scan(&relayPids, &allPids, &c.wal, &c.relayXacts, &c.stmts, &c.planMs, &c.execMs)
	if err != nil {
		b.Fatal(err)
	}
	c.relayCPU, c.allCPU = pidsCPU(relayPids), pidsCPU(allPids)
	return c
}

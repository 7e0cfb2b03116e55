package wal

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// archiveSetup creates an outbox in a fresh database and returns a pool
// whose connections report their statements to tracer (when not nil), and
// the delete-mode archive statement.
func archiveSetup(tb testing.TB, tracer pgx.QueryTracer) (*pgxpool.Pool, string) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.NewDB(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	l := schema.Layout{Outbox: schema.Table{Schema: "public", Name: "outbox"}, Cols: testLayout.Cols}
	l.Cols.AggregateID, l.Cols.Payload = "aggregate_id", "payload"
	if _, err := pool.Exec(ctx, l.CreateOutbox()); err != nil {
		tb.Fatal(err)
	}
	info, err := schema.Inspect(ctx, pool, l)
	if err != nil {
		tb.Fatal(err)
	}
	return pool, buildQueries(l, schema.ArchiveDelete, info, "s").archive
}

// insertRows inserts n outbox rows and returns their ids.
func insertRows(tb testing.TB, pool *pgxpool.Pool, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT unnest($1::uuid[]), 'order', 'a', 'created', '{}'`, ids); err != nil {
		tb.Fatal(err)
	}
	return ids
}

// BenchmarkArchive measures archiving (delete mode) a batch of 500 rows
// with one statement, as the archiver does after a publish; each op is one
// batch, its rows inserted untimed beforehand.
func BenchmarkArchive(b *testing.B) {
	ctx := context.Background()
	pool, query := archiveSetup(b, nil)
	a := newArchiver(ctx, pool, query, 12000, 500)
	const n = 500
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		ids := insertRows(b, pool, n)
		b.StartTimer()
		if err := a.exec(ctx, ids, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
}

// statementCounter counts the statements run on a pool's connections.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestArchiverGroupsAStreamOfBatches: a stream of single-row batches, one
// completed every millisecond as small transactions stream, is archived
// in a statement per 10 ms or fewer, not in one (or two) per batch, and
// every row is archived.
func TestArchiverGroupsAStreamOfBatches(t *testing.T) {
	ctx := context.Background()
	counter := &statementCounter{}
	pool, query := archiveSetup(t, counter)
	ids := insertRows(t, pool, 60)
	a := newArchiver(ctx, pool, query, 12000, 500)
	counter.n.Store(0)
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	start := time.Now()
	for _, id := range ids {
		wg.Go(func() { errs <- a.archive(ctx, []string{id}, nil) })
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left after archiving (%v)", left, err)
	}
	if n, most := counter.n.Load(), int64(took/(10*time.Millisecond))+2; n > most {
		t.Errorf("%d batches over %v archived in %d statements, want at most %d", len(ids), took.Round(time.Millisecond), n, most)
	}
}

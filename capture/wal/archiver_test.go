package wal

import (
	"context"
	"fmt"
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
// the delete-mode archive statements: by id, and by seq.
func archiveSetup(tb testing.TB, tracer pgx.QueryTracer) (*pgxpool.Pool, string, *schema.SeqArchive) {
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
	bySeq := l.ArchiveBySeq(schema.ArchiveDelete)
	return pool, buildQueries(l, schema.ArchiveDelete, info, "s").archive, &bySeq
}

// insertRows inserts n outbox rows and returns their ids and seq values.
func insertRows(tb testing.TB, pool *pgxpool.Pool, n int) ([]string, []int64) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	rows, _ := pool.Query(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT unnest($1::uuid[]), 'order', 'a', 'created', '{}' RETURNING id::text, seq`, ids)
	seqOf := map[string]int64{}
	var id string
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &seq}, func() error { seqOf[id] = seq; return nil }); err != nil {
		tb.Fatal(err)
	}
	seqs := make([]int64, n)
	for i, id := range ids {
		seqs[i] = seqOf[id]
	}
	return ids, seqs
}

// BenchmarkArchive measures archiving (delete mode) a batch of rows with
// one statement, as the archiver does after a publish, by id and by seq;
// each op is one batch, its rows inserted untimed beforehand.
func BenchmarkArchive(b *testing.B) {
	for _, n := range []int{60, 500} {
		for _, key := range []string{"id", "seq"} {
			b.Run(fmt.Sprintf("%s/%d", key, n), func(b *testing.B) {
				ctx := context.Background()
				pool, query, bySeq := archiveSetup(b, nil)
				if key == "id" {
					bySeq = nil
				}
				a := newArchiver(ctx, pool, query, bySeq, 12000, 500)
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					ids, seqs := insertRows(b, pool, n)
					b.StartTimer()
					if err := a.exec(ctx, ids, seqs, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
			})
		}
	}
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
	pool, query, bySeq := archiveSetup(t, counter)
	ids, seqs := insertRows(t, pool, 60)
	a := newArchiver(ctx, pool, query, bySeq, 12000, 500)
	counter.n.Store(0)
	errs := make(chan error, len(ids))
	var wg sync.WaitGroup
	start := time.Now()
	for i, id := range ids {
		wg.Go(func() { errs <- a.archive(ctx, []string{id}, seqs[i:i+1], nil) })
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

// TestSeqArchiveNeedsUniqueSeq: published rows are archived by seq only
// once a unique index covers seq; before, a row sharing a published row's
// seq could go with it, so they are archived by id.
func TestSeqArchiveNeedsUniqueSeq(t *testing.T) {
	ctx := context.Background()
	pool, _, _ := archiveSetup(t, nil)
	l := schema.Layout{Outbox: schema.Table{Schema: "public", Name: "outbox"}, Cols: testLayout.Cols}
	l.Cols.AggregateID, l.Cols.Payload = "aggregate_id", "payload"
	opts := Options{Pool: pool, ArchiveMode: schema.ArchiveDelete}
	for _, unique := range []bool{false, true} {
		if unique {
			if _, err := pool.Exec(ctx, l.CreatePollIndex()); err != nil {
				t.Fatal(err)
			}
		}
		info, err := schema.Inspect(ctx, pool, l)
		if err != nil {
			t.Fatal(err)
		}
		a, err := seqArchive(ctx, opts, l, info)
		if err != nil || (a != nil) != unique {
			t.Errorf("unique seq index %v: archive by seq %v (%v)", unique, a != nil, err)
		}
	}
}

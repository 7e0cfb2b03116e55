package wal

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// BenchmarkArchive measures archiving (delete mode) a batch of 500 rows
// with one statement, as the archiver does after a publish; each op is one
// batch, its rows inserted untimed beforehand.
func BenchmarkArchive(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDB(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	l := schema.Layout{Outbox: schema.Table{Schema: "public", Name: "outbox"}, Cols: testLayout.Cols}
	l.Cols.AggregateID, l.Cols.Payload = "aggregate_id", "payload"
	if _, err := pool.Exec(ctx, l.CreateOutbox()); err != nil {
		b.Fatal(err)
	}
	info, err := schema.Inspect(ctx, pool, l)
	if err != nil {
		b.Fatal(err)
	}
	a := newArchiver(ctx, pool, buildQueries(l, schema.ArchiveDelete, info, "s").archive, 12000)
	const n = 500
	ids := make([]string, n)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := range ids {
			ids[i] = uuid.NewString()
		}
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT unnest($1::uuid[]), 'order', 'a', 'created', '{}'`, ids); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := a.exec(ctx, ids, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
}

package schema

import (
	"github.com/outboxrelay/relay/capture/table"

	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestPruneArchiveBounded runs the move mode's prune statement on a real
// archive table: it deletes at most its limit per run, only rows past the
// retention, and an empty statement stands for delete mode.
func TestPruneArchiveBounded(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l := Layout{Archive: table.ParseName("public.arch")}
	if _, err := conn.Exec(ctx, `CREATE TABLE arch (id int, archived_at timestamptz NOT NULL);
		INSERT INTO arch SELECT i, now() - interval '2 hours' FROM generate_series(1, 7) i;
		INSERT INTO arch SELECT i, now() FROM generate_series(8, 9) i`); err != nil {
		t.Fatal(err)
	}
	if s := l.PruneArchive(ArchiveDelete); s != "" {
		t.Fatalf("delete mode prunes with %q, want no statement", s)
	}
	stmt := l.PruneArchive(ArchiveMove)
	for _, want := range []int64{3, 3, 1, 0} {
		tag, err := conn.Exec(ctx, stmt, "1 hour", 3)
		if err != nil {
			t.Fatal(err)
		}
		if tag.RowsAffected() != want {
			t.Fatalf("pruned %d rows, want %d", tag.RowsAffected(), want)
		}
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM arch`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 2 {
		t.Fatalf("%d rows left, want the 2 inside the retention", left)
	}
}

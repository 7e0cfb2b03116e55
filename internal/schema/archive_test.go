package schema

import (
	"github.com/outboxrelay/relay/capture/table"

	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestArchiveByKeyPerMode runs each archive mode's statements, ArchiveByKey
// and ArchiveByKeyRange, on a real outbox of four rows, archiving the first
// and third by seq: delete removes them, mark sets published_at so that
// Unpublished keeps only the others, move puts them into the archive table
// with their ids. Other rows, also the second one, inside the range, stay
// untouched.
func TestArchiveByKeyPerMode(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, mode := range []string{ArchiveDelete, ArchiveMark, ArchiveMove} {
		for _, form := range []string{"keys", "range"} {
			t.Run(mode+"/"+form, func(t *testing.T) {
				l := Layout{
					Outbox: table.ParseName("outbox_" + mode + "_" + form),
					Cols: Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
						Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
					Archive: table.ParseName("archive_" + mode + "_" + form),
				}
				for _, stmt := range append([]string{l.CreateOutbox()}, l.ArchiveDDL(mode, nil)...) {
					if _, err := conn.Exec(ctx, stmt); err != nil {
						t.Fatalf("%v\n%s", err, stmt)
					}
				}
				var ids []string
				var seqs []int64
				for range 4 {
					id := uuid.NewString()
					var seq int64
					if err := conn.QueryRow(ctx, "INSERT INTO "+l.Outbox.Ident()+" ("+l.insertColumns()+
						") VALUES ($1, 't', 'a', 'e', '{}', NULL, now()) RETURNING seq", id).Scan(&seq); err != nil {
						t.Fatal(err)
					}
					ids, seqs = append(ids, id), append(seqs, seq)
				}
				stmt, args := l.ArchiveByKey(mode, l.Cols.Seq, "bigint"), []any{[]int64{seqs[0], seqs[2]}}
				if form == "range" {
					stmt, args = l.ArchiveByKeyRange(mode, l.Cols.Seq, "bigint"), append(args, seqs[0], seqs[2])
				}
				tag, err := conn.Exec(ctx, stmt, args...)
				if err != nil || tag.RowsAffected() != 2 {
					t.Fatalf("archived %d rows, %v; want 2\n%s", tag.RowsAffected(), err, stmt)
				}
				kept := []string{ids[1], ids[3]}
				left := idsOf(t, conn, "SELECT id::text FROM "+l.Outbox.Ident()+" o WHERE true "+l.Unpublished(mode, "o"))
				if !slices.Equal(left, sorted(kept)) {
					t.Errorf("unpublished rows %v, want %v", left, kept)
				}
				all := idsOf(t, conn, "SELECT id::text FROM "+l.Outbox.Ident())
				var archived []string
				switch mode {
				case ArchiveMark:
					if !slices.Equal(all, sorted(ids)) {
						t.Errorf("outbox holds %v, want every row %v, marked", all, ids)
					}
				case ArchiveMove:
					archived = idsOf(t, conn, "SELECT id::text FROM "+l.Archive.Ident()+" WHERE archived_at IS NOT NULL")
					fallthrough
				default:
					if !slices.Equal(all, sorted(kept)) {
						t.Errorf("outbox holds %v, want %v", all, kept)
					}
				}
				if want := sorted([]string{ids[0], ids[2]}); mode == ArchiveMove && !slices.Equal(archived, want) {
					t.Errorf("archive table holds %v, want %v", archived, want)
				}
			})
		}
	}
}

// TestUnpublished checks the mark mode's filter text, with and without an
// alias, and that the other modes filter nothing.
func TestUnpublished(t *testing.T) {
	var l Layout
	for _, tc := range []struct{ mode, alias, want string }{
		{ArchiveMark, "", `AND "published_at" IS NULL`},
		{ArchiveMark, "o", `AND o."published_at" IS NULL`},
		{ArchiveDelete, "o", ""},
		{ArchiveMove, "", ""},
	} {
		if got := l.Unpublished(tc.mode, tc.alias); got != tc.want {
			t.Errorf("Unpublished(%s, %q) = %q, want %q", tc.mode, tc.alias, got, tc.want)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// idsOf returns the ids query selects, sorted.
func idsOf(t *testing.T, conn *pgx.Conn, query string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), query+" ORDER BY 1")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", query, err))
	}
	return ids
}

// TestSeqArchiveDensity: seqs that fill at least a quarter of their range
// are archived with the range statement, sparser ones key by key.
func TestSeqArchiveDensity(t *testing.T) {
	q := SeqArchive{list: "keys", rng: "range"}
	for _, tc := range []struct {
		seqs []int64
		want string
	}{
		{[]int64{7}, "range"},
		{[]int64{5, 6, 7, 9}, "range"},
		{[]int64{13, 10, 22, 12}, "range"},
		{[]int64{40, 10, 20, 30}, "keys"},
		{[]int64{1, 100}, "keys"},
		{[]int64{9, 1, 5}, "range"},
		{[]int64{1, 2, 3, 1000}, "keys"},
	} {
		sql, args := q.Of(tc.seqs)
		if sql != tc.want {
			t.Errorf("%v: %s, want %s", tc.seqs, sql, tc.want)
		}
		if sql == "range" && (args[1] != slices.Min(tc.seqs) || args[2] != slices.Max(tc.seqs)) {
			t.Errorf("%v: range %v..%v", tc.seqs, args[1], args[2])
		}
	}
}

package schema

import (
	"github.com/outboxrelay/relay/capture/table"

	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestDeadLetterFilter lists and drops dead letters on a real table by id,
// aggregate, age and their combination: each filter selects exactly its
// rows, oldest failure first, and an empty filter selects all.
func TestDeadLetterFilter(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l := Layout{
		Cols: Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type",
			Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
		DeadLetter: table.ParseName("dead"),
	}
	for _, stmt := range l.CreateDeadLetter(nil) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%v\n%s", err, stmt)
		}
	}
	ids := make([]string, 4) // failed 4, 3, 2 and 0 hours ago; the first two of aggregate a
	for i, agg := range []string{"a", "a", "b", "b"} {
		ids[i] = uuid.NewString()
		ago := []int{4, 3, 2, 0}[i]
		if _, err := conn.Exec(ctx, `INSERT INTO dead (id, aggregate_type, aggregate_id, event_type, payload, seq, error, attempts, last_failed_at)
			VALUES ($1, 't', $2, 'e', '{}', $3, 'boom', 1, now() - make_interval(hours => $4))`, ids[i], agg, i+1, ago); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		f    DeadLetterFilter
		want []string
	}{
		{"all", DeadLetterFilter{}, ids},
		{"ids", DeadLetterFilter{IDs: []string{ids[3], ids[1]}}, []string{ids[1], ids[3]}},
		{"aggregate", DeadLetterFilter{Aggregate: "b"}, ids[2:]},
		{"older than", DeadLetterFilter{OlderThan: 150 * time.Minute}, ids[:2]},
		{"aggregate and age", DeadLetterFilter{Aggregate: "b", OlderThan: time.Hour}, ids[2:3]},
		{"none", DeadLetterFilter{Aggregate: "c"}, nil},
	} {
		dls, err := l.ListDeadLetters(ctx, conn, tc.f, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range dls {
			got = append(got, d.ID)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: listed %v, want %v", tc.name, got, tc.want)
		}
	}
	if n, err := l.DropDeadLetters(ctx, conn, DeadLetterFilter{Aggregate: "a", OlderThan: 200 * time.Minute}, false); err != nil || n != 1 {
		t.Fatalf("dropped %d, %v; want the 1 of aggregate a older than 200m", n, err)
	}
	if left := idsOf(t, conn, "SELECT id::text FROM dead"); !slices.Equal(left, sorted(ids[1:])) {
		t.Errorf("left %v, want %v", left, sorted(ids[1:]))
	}
}

package schema

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestInitReplacesAggregateIndex runs the init steps on a dead-letter table
// of an earlier release, whose btree index on aggregate_id refuses a 2 MB
// aggregate id: the steps build the hash index and drop the btree one, a
// second run does nothing, and the dead letter then fits. relay run warns
// of the btree index until then. The park check and the dlq filters use
// the new index.
func TestInitReplacesAggregateIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	l := Layout(table.DefaultLayout())
	if _, err := conn.Exec(ctx, l.CreateOutbox()); err != nil {
		t.Fatal(err)
	}
	// The dead-letter table as earlier releases created it.
	old := strings.Replace(strings.Join(l.CreateDeadLetter(nil), ";\n"),
		`"outbox_dead_letter_aggregate_hash_idx" ON "public"."outbox_dead_letter" (hashtext("aggregate_id"))`,
		`"outbox_dead_letter_aggregate_idx" ON "public"."outbox_dead_letter" ("aggregate_id")`, 1)
	if !strings.Contains(old, "outbox_dead_letter_aggregate_idx") {
		t.Fatalf("the old DDL was not built:\n%s", old)
	}
	if _, err := conn.Exec(ctx, old); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO outbox_dead_letter (id, aggregate_type, aggregate_id, event_type, payload, seq)
		VALUES (gen_random_uuid(), 't', repeat(md5(random()::text), 65536), 'e', '{}', 1)`
	if _, err := conn.Exec(ctx, insert); err == nil {
		t.Fatal("the btree index of earlier releases took a 2 MB aggregate id")
	}
	if ws, err := l.Warnings(ctx, conn, false, ArchiveDelete); err != nil || len(ws) != 1 || !strings.Contains(ws[0].What, "btree index") {
		t.Fatalf("warnings before the migration: %v, %v", ws, err)
	}
	for round := range 2 {
		for _, s := range l.InitSteps(false, ArchiveDelete, nil) {
			if err := s.Run(ctx, conn); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		var idx []string
		rows, _ := conn.Query(ctx, `SELECT c.relname || ' ' || a.amname || ' ' || i.indisvalid FROM pg_index i
			JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
			WHERE i.indrelid = 'outbox_dead_letter'::regclass ORDER BY 1`)
		if idx, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		want := "outbox_dead_letter_aggregate_hash_idx btree true,outbox_dead_letter_id_idx btree true"
		if got := strings.Join(idx, ","); got != want {
			t.Fatalf("round %d: indexes %s, want %s", round, got, want)
		}
	}
	if _, err := conn.Exec(ctx, insert); err != nil {
		t.Fatalf("a 2 MB aggregate id after the migration: %v", err)
	}
	ws, err := l.Warnings(ctx, conn, false, ArchiveDelete)
	if err != nil || len(ws) != 0 {
		t.Fatalf("warnings after the migration: %v, %v", ws, err)
	}
	// The queries on ordering keys use the index (a seq scan is what the
	// planner picks on a table this small, so it is ruled out).
	if _, err := conn.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	after, through := int32(1), int32(7)
	cond, args := l.where(DeadLetterFilter{Aggregate: "order-1", After: &after, Through: &through})
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{fmt.Sprintf(`SELECT 1 FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM outbox_dead_letter d WHERE %s)`, l.SameKey("d", "o")), nil},
		{`SELECT 1 FROM outbox_dead_letter WHERE ` + cond, args},
	} {
		var plan []string
		rows, _ := conn.Query(ctx, "EXPLAIN "+q.sql, q.args...)
		if plan, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatalf("%v\n%s", err, q.sql)
		}
		if !strings.Contains(strings.Join(plan, "\n"), "outbox_dead_letter_aggregate_hash_idx") {
			t.Errorf("the plan does not use the index:\n%s\n%s", q.sql, strings.Join(plan, "\n"))
		}
	}
}

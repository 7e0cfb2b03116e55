package schema

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/helpers/outbox"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestInitCreatesTheApplicationsOutbox checks that the outbox table and poll
// index `relay init` creates (CreateOutbox and the poll index step of the
// default layout) are the ones applications create with the helpers'
// outbox.DDL, the project's one text of the contract's table: the same
// columns, types, nullability, defaults, identity, primary key and index,
// read back from the catalog of two real databases.
func TestInitCreatesTheApplicationsOutbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := Layout{
		Outbox: Table{Schema: "public", Name: "outbox"},
		Cols: Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
			EventType: "event_type", Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
	}
	fromHelpers := outboxCatalog(t, ctx, outbox.DDL)
	fromInit := outboxCatalog(t, ctx, l.CreateOutbox(), l.pollIndex().create(false))
	if !reflect.DeepEqual(fromHelpers, fromInit) {
		t.Fatalf("relay init's outbox differs from outbox.DDL:\ninit:    %q\nhelpers: %q", fromInit, fromHelpers)
	}
}

// outboxCatalog runs stmts in a new database and returns what its catalog
// says of public.outbox: one line per column, constraint and index.
func outboxCatalog(t *testing.T, ctx context.Context, stmts ...string) []string {
	t.Helper()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	rows, err := conn.Query(ctx, `
SELECT format('column %s %s not null %s identity %s default %s', attname, format_type(atttypid, atttypmod),
              attnotnull, attidentity, coalesce(pg_get_expr(adbin, adrelid), ''))
  FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
 WHERE attrelid = 'public.outbox'::regclass AND attnum > 0 AND NOT attisdropped
UNION ALL
SELECT format('constraint %s %s', contype, pg_get_constraintdef(oid)) FROM pg_constraint WHERE conrelid = 'public.outbox'::regclass
UNION ALL
SELECT format('index %s', pg_get_indexdef(indexrelid)) FROM pg_index WHERE indrelid = 'public.outbox'::regclass
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

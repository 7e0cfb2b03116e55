// Package outbox writes events to the relay's outbox table in
// the application's own transaction, so an event is published if and only if
// the business write it describes commits.
//
//	tx, err := pool.Begin(ctx)
//	// ... the business write, in tx ...
//	id, err := outbox.Write(ctx, tx, outbox.Event{
//		AggregateType: "order",
//		AggregateID:   order.ID,
//		EventType:     "order.created",
//		Payload:       order,
//	})
//	err = tx.Commit(ctx)
//
// Write and WriteMany take an Execer: a pgx.Tx, *pgx.Conn or *pgxpool.Pool.
// SQL adapts a database/sql *sql.Tx. The package-level functions write to
// public.outbox with the contract's column names; New takes another table
// name and column mapping, as the relay's outbox.table and outbox.columns.
// Emit writes the same event without a table, as a logical decoding message
// for the relay's table-free outbox (capture.wal.source: messages).
package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer executes one SQL statement with $n placeholders. pgx.Tx, *pgx.Conn
// and *pgxpool.Pool implement it; SQL adapts database/sql.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is the method of *sql.Tx, *sql.DB and *sql.Conn that SQL uses.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// SQL adapts a database/sql transaction (or *sql.DB, *sql.Conn) to Execer,
// for example outbox.Write(ctx, outbox.SQL(tx), e), with a driver that
// takes $n placeholders, such as github.com/jackc/pgx/v5/stdlib. The command
// tags it returns are empty, as database/sql reports none.
func SQL(db SQLExecer) Execer { return sqlExecer{db} }

type sqlExecer struct{ db SQLExecer }

func (s sqlExecer) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	_, err := s.db.ExecContext(ctx, query, args...)
	return pgconn.CommandTag{}, err
}

// std is the contract's table public.outbox with its own column names.
var std, _ = New(Options{})

// Write inserts e into public.outbox with db, usually the transaction of the
// business write, and returns the event's id. See Table.Write.
func Write(ctx context.Context, db Execer, e Event) (string, error) {
	return std.Write(ctx, db, e)
}

// WriteMany inserts events into public.outbox with db in one statement and
// returns their ids in order. See Table.WriteMany.
func WriteMany(ctx context.Context, db Execer, events ...Event) ([]string, error) {
	return std.WriteMany(ctx, db, events...)
}

// TableDDL creates the table public.outbox, when missing, with the columns
// the relay reads. It is the one text of the contract's table: the relay's
// own tests create their outbox with it, and a test checks that `relay
// init` creates the same table.
const TableDDL = `CREATE TABLE IF NOT EXISTS public.outbox (
  id             uuid        PRIMARY KEY,
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb       NOT NULL,
  headers        jsonb,
  created_at     timestamptz NOT NULL DEFAULT now(),
  seq            bigint      GENERATED ALWAYS AS IDENTITY
)`

// DDL is TableDDL and an index on seq for the relay's poll mode (the index
// `relay init` creates too).
const DDL = TableDDL + `;
CREATE UNIQUE INDEX IF NOT EXISTS outbox_relay_seq_idx ON public.outbox (seq);
`

// CreateTable runs DDL with db. Run it once, at startup or in a migration:
// concurrent first runs of CREATE TABLE IF NOT EXISTS can fail in
// PostgreSQL. A database/sql handle works through SQL.
func CreateTable(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, DDL); err != nil {
		return fmt.Errorf("outbox: create public.outbox: %w", err)
	}
	return nil
}

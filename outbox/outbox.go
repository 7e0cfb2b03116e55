// Package outbox writes events to the relay's outbox table (CONTRACT §1) in
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
package outbox

import (
	"context"
	"database/sql"

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

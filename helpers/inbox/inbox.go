// Package inbox makes a message handler idempotent, turning at-least-once
// delivery into exactly-once effects: it records each message_id in a
// processed-messages table in the same transaction as the handler's work.
//
//	processed, err := inbox.Handle(ctx, pool, msg.ID, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", amount, id)
//		return err
//	})
//
// The record is an INSERT … ON CONFLICT DO NOTHING on the table's primary
// key, the consumer's name and the message_id: several consumers of the same
// messages (a billing and a shipping handler) may share one table, each
// named with ForConsumer; the package-level functions and New use
// DefaultConsumer. One row inserted means the message is new: the handler runs and its
// work commits together with the record, or neither does. No row inserted
// means an earlier delivery committed: the handler is skipped and nothing
// commits, so a redelivery is acknowledged without a second effect.
//
// Concurrent deliveries of one message, at the default READ COMMITTED
// isolation: the second INSERT waits for the first transaction's
// uncommitted key. If the first commits, the second inserts no row and skips
// the handler; if it rolls back, the second inserts the row and runs the
// handler. So at most one delivery's effects ever commit, whatever the
// timing. At REPEATABLE READ or SERIALIZABLE the waiting delivery fails with
// a serialization error instead of skipping; retry it (or redeliver) and it
// skips.
//
// The package-level functions use DefaultTable; New names another table.
package inbox

import (
	"context"
	"database/sql"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer executes one SQL statement with $n placeholders. pgx.Tx, *pgx.Conn
// and *pgxpool.Pool implement it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Beginner begins a transaction. *pgxpool.Pool and *pgx.Conn implement it,
// and so does pgx.Tx, whose Begin starts a savepoint.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// SQLBeginner begins a database/sql transaction. *sql.DB and *sql.Conn
// implement it.
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// SQLExecer executes one SQL statement with database/sql. *sql.DB, *sql.Conn
// and *sql.Tx implement it.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// std is DefaultTable.
var std, _ = New("")

// ForConsumer returns DefaultTable seen by the consumer named name. See
// Table.ForConsumer.
func ForConsumer(name string) *Table { return std.ForConsumer(name) }

// CreateTable creates DefaultTable and its index when missing. See
// Table.CreateTable.
func CreateTable(ctx context.Context, db Execer) error { return std.CreateTable(ctx, db) }

// Claim records messageID in DefaultTable within tx. See Table.Claim.
func Claim(ctx context.Context, tx Execer, messageID string) (bool, error) {
	return std.Claim(ctx, tx, messageID)
}

// ClaimSQL records messageID in DefaultTable within tx. See Table.ClaimSQL.
func ClaimSQL(ctx context.Context, tx *sql.Tx, messageID string) (bool, error) {
	return std.ClaimSQL(ctx, tx, messageID)
}

// Handle runs fn once per messageID, recorded in DefaultTable. See
// Table.Handle.
func Handle(ctx context.Context, db Beginner, messageID string, fn func(context.Context, pgx.Tx) error) (bool, error) {
	return std.Handle(ctx, db, messageID, fn)
}

// HandleSQL runs fn once per messageID, recorded in DefaultTable. See
// Table.HandleSQL.
func HandleSQL(ctx context.Context, db SQLBeginner, messageID string, fn func(context.Context, *sql.Tx) error) (bool, error) {
	return std.HandleSQL(ctx, db, messageID, fn)
}

// Prune deletes records older than olderThan from DefaultTable. See
// Table.Prune.
func Prune(ctx context.Context, db Execer, olderThan time.Duration) (int64, error) {
	return std.Prune(ctx, db, olderThan)
}

// PruneSQL deletes records older than olderThan from DefaultTable. See
// Table.PruneSQL.
func PruneSQL(ctx context.Context, db SQLExecer, olderThan time.Duration) (int64, error) {
	return std.PruneSQL(ctx, db, olderThan)
}

package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultTable is the processed-messages table of the package-level
// functions and of New with an empty name.
const DefaultTable = "public.processed_messages"

// DefaultConsumer is the consumer name of the package-level functions and
// of the tables New returns, for an application with one consumer.
const DefaultConsumer = "default"

// ErrOldLayout is wrapped by the errors of a table that has the layout of
// helpers v0.1 and earlier, keyed by message_id alone. Migrate it with the
// statements of Table.MigrationDDL.
var ErrOldLayout = errors.New("keyed by message_id alone, the layout before helpers v0.2")

// Table is a processed-messages table, keyed by consumer and message_id,
// seen by one consumer: each consumer's handler runs once per message,
// whatever other consumers of the same messages do with the same table. It
// is immutable and safe for concurrent use.
type Table struct {
	ident    string   // the quoted table name
	name     string   // the table name without schema, for index names
	consumer string   // the consumer's name
	ddl      []string // CREATE TABLE, check, CREATE INDEX
	insert   string   // the claim
	delete   string   // the prune
}

// New returns the processed-messages table named table, seen by
// DefaultConsumer: table is "name" or "schema.name", a name without a schema
// being in public; "" is DefaultTable. Identifiers are always quoted.
func New(table string) (*Table, error) {
	table = cmp.Or(table, DefaultTable)
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		schema, name = "public", table
	}
	if schema == "" || name == "" {
		return nil, fmt.Errorf("inbox: table %q: want name or schema.name", table)
	}
	t := &Table{ident: pgx.Identifier{schema, name}.Sanitize(), name: name, consumer: DefaultConsumer}
	t.ddl = []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  consumer     text        NOT NULL,
  message_id   text        NOT NULL,
  processed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
)`, t.ident),
		fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)",
			pgx.Identifier{name + "_processed_at_idx"}.Sanitize(), t.ident),
	}
	t.insert = fmt.Sprintf("INSERT INTO %s (consumer, message_id) VALUES ($1, $2) ON CONFLICT (consumer, message_id) DO NOTHING", t.ident)
	t.delete = fmt.Sprintf("DELETE FROM %s WHERE processed_at < now() - $1::bigint * interval '1 microsecond'", t.ident)
	return t, nil
}

// ForConsumer returns the same table seen by the consumer named name ("" is
// DefaultConsumer). Give each handler that consumes the same messages into
// one table a name of its own (a constant, such as "billing"): the records
// of one consumer never make another skip a message.
func (t *Table) ForConsumer(name string) *Table {
	c := *t
	c.consumer = cmp.Or(name, DefaultConsumer)
	return &c
}

// Consumer returns the consumer name of the table's records.
func (t *Table) Consumer() string { return t.consumer }

// MigrationDDL returns the statements that migrate a table created by
// helpers v0.1 or earlier (message_id alone as primary key, named
// NAME_pkey) to the current layout, its records becoming DefaultConsumer's.
// Run them one at a time, outside a transaction (the index is built
// CONCURRENTLY, without blocking writes; the last statement takes a brief
// exclusive lock); deliveries handled meanwhile by the old version are
// recorded as DefaultConsumer's.
func (t *Table) MigrationDDL() string {
	idx := pgx.Identifier{t.name + "_consumer_message_id_key"}.Sanitize()
	pkey := pgx.Identifier{t.name + "_pkey"}.Sanitize()
	return strings.Join([]string{
		fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS consumer text NOT NULL DEFAULT %s",
			t.ident, "'"+DefaultConsumer+"'"),
		fmt.Sprintf("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (consumer, message_id)", idx, t.ident),
		fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s, ADD CONSTRAINT %s PRIMARY KEY USING INDEX %s",
			t.ident, pkey, pkey, idx),
	}, ";\n") + ";\n"
}

// DDL returns the statements that CreateTable runs, for a migration tool.
func (t *Table) DDL() string { return strings.Join(t.ddl, ";\n") + ";\n" }

// CreateTable creates the table and its processed_at index when missing.
// Run it once, at startup or in a migration: concurrent first runs of
// CREATE TABLE IF NOT EXISTS can fail in PostgreSQL. A table of the old
// layout returns an error wrapping ErrOldLayout and is left as it is.
func (t *Table) CreateTable(ctx context.Context, db Execer) error {
	for i, stmt := range t.ddl {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: create %s: %w", t.ident, err)
		}
		if i > 0 {
			continue
		}
		if _, err := db.Exec(ctx, "SELECT consumer FROM "+t.ident+" LIMIT 0"); err != nil {
			return t.recordErr("check", err)
		}
	}
	return nil
}

// recordErr wraps err of a statement on the table, adding ErrOldLayout and
// the way out when the table has the old layout: no consumer column
// (undefined_column), or no key on (consumer, message_id) yet
// (invalid_column_reference).
func (t *Table) recordErr(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42703" || pgErr.Code == "42P10") {
		return fmt.Errorf("inbox: %s %s: %w; migrate it with the statements of Table.MigrationDDL: %v",
			what, t.ident, ErrOldLayout, err)
	}
	return fmt.Errorf("inbox: %s %s: %w", what, t.ident, err)
}

// Claim records messageID for the table's consumer within tx, the
// transaction of the handler's work, and reports whether it is new to that
// consumer. False means an earlier transaction recorded it and committed: skip the work and roll back. Claim waits while
// another open transaction holds the same messageID, and then reports false
// if it committed and true if it rolled back. Use it when you begin and
// commit the transaction yourself; Handle does both.
func (t *Table) Claim(ctx context.Context, tx Execer, messageID string) (bool, error) {
	if messageID == "" {
		return false, errEmptyID
	}
	tag, err := tx.Exec(ctx, t.insert, t.consumer, messageID)
	if err != nil {
		return false, t.recordErr(fmt.Sprintf("record %q in", messageID), err)
	}
	return tag.RowsAffected() == 1, nil
}

// ClaimSQL is Claim for a database/sql transaction.
func (t *Table) ClaimSQL(ctx context.Context, tx *sql.Tx, messageID string) (bool, error) {
	if messageID == "" {
		return false, errEmptyID
	}
	res, err := tx.ExecContext(ctx, t.insert, t.consumer, messageID)
	if err == nil {
		var n int64
		n, err = res.RowsAffected()
		if err == nil {
			return n == 1, nil
		}
	}
	return false, t.recordErr(fmt.Sprintf("record %q in", messageID), err)
}

var errEmptyID = errors.New("inbox: empty message id")

// Handle runs fn for a new message and skips a processed one. It begins a
// transaction on db, claims messageID in it (see Claim) and, when the
// message is new, runs fn in the same transaction and commits, so fn's work
// and the record commit together or not at all. It returns true when fn ran
// and committed, and false with a nil error when an earlier delivery had
// processed the message; nothing commits then. When fn or the commit fails,
// it rolls back, record included, and returns the error (fn's unwrapped), so
// a redelivery processes the message again; a failed commit may still have
// committed, and a redelivery then skips. fn must do its work with tx and
// must not commit or roll it back. Acknowledge the message to the broker
// only after Handle returned a nil error. Handle is safe for concurrent use,
// also by deliveries of one message, whose work commits at most once (see
// the package documentation).
func (t *Table) Handle(ctx context.Context, db Beginner, messageID string, fn func(context.Context, pgx.Tx) error) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) // after Commit, a no-op
	ok, err := t.Claim(ctx, tx, messageID)
	if err != nil || !ok {
		return false, err
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox: commit %q: %w", messageID, err)
	}
	return true, nil
}

// HandleSQL is Handle for database/sql: fn runs in a *sql.Tx begun on db
// with the default options.
func (t *Table) HandleSQL(ctx context.Context, db SQLBeginner, messageID string, fn func(context.Context, *sql.Tx) error) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback() // after Commit, a no-op
	ok, err := t.ClaimSQL(ctx, tx, messageID)
	if err != nil || !ok {
		return false, err
	}
	if err := fn(ctx, tx); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox: commit %q: %w", messageID, err)
	}
	return true, nil
}

// Prune deletes the records, of every consumer, of messages processed more
// than olderThan ago by the database's clock, in one statement, and returns
// how many it deleted. A redelivery of a pruned message runs its handler again, so
// olderThan must exceed the longest time a message can still be redelivered
// (broker retention and redelivery, relay outages); it must be positive.
// Run it often, so each run deletes few rows; it uses the processed_at
// index and is safe to run concurrently with Handle.
func (t *Table) Prune(ctx context.Context, db Execer, olderThan time.Duration) (int64, error) {
	if err := checkAge(olderThan); err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, t.delete, olderThan.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("inbox: prune %s: %w", t.ident, err)
	}
	return tag.RowsAffected(), nil
}

// PruneSQL is Prune for database/sql.
func (t *Table) PruneSQL(ctx context.Context, db SQLExecer, olderThan time.Duration) (int64, error) {
	if err := checkAge(olderThan); err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, t.delete, olderThan.Microseconds())
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("inbox: prune %s: %w", t.ident, err)
}

// checkAge rejects an olderThan that would prune records just written.
func checkAge(olderThan time.Duration) error {
	if olderThan <= 0 {
		return fmt.Errorf("inbox: prune: olderThan %v is not positive", olderThan)
	}
	return nil
}

// Package table names the tables a relay works on: the outbox, its columns,
// the dead-letter table and the archive table.
//
// It is public so that a program outside this module can build the Layout
// that capture/poll and capture/wal take (moving those packages under
// internal instead would have closed them to every other program);
// everything else the relay knows of these tables (DDL, inspection,
// dead-letter queries) stays in internal/schema, whose Layout is defined
// from this one. It imports nothing else of the module, so the import graph
// stays one-way: internal/schema and the capture packages build on it.
package table

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements: a *pgx.Conn, a *pgxpool.Pool or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Name is a schema-qualified table name. Its values are used as they are,
// quoted wherever they go into SQL; they are case-sensitive.
type Name struct{ Schema, Name string }

// ParseName splits "schema.name" at the first dot; without a dot the schema
// is "public".
func ParseName(qualified string) Name {
	if s, n, ok := strings.Cut(qualified, "."); ok {
		return Name{Schema: s, Name: n}
	}
	return Name{Schema: "public", Name: qualified}
}

// Ident returns the quoted identifier for SQL.
func (t Name) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// String returns schema.name for messages.
func (t Name) String() string { return t.Schema + "." + t.Name }

// Columns are the outbox's column names: the documented names, or the
// names the outbox.columns setting maps them to.
type Columns struct {
	ID, AggregateType, AggregateID, EventType, Payload, Headers, CreatedAt, Seq string
	// OrderBy is the order column (outbox.order_by) when it is not
	// AggregateID, empty otherwise. It may have any type; it is read as
	// text.
	OrderBy string
}

// DefaultColumns returns the documented column names, with no order column.
func DefaultColumns() Columns {
	return Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
		EventType: "event_type", Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "seq"}
}

// List returns the column names in contract order, then OrderBy when set:
// the columns the relay reads and carries into the dead-letter and archive
// tables.
func (c Columns) List() []string {
	l := []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload, c.Headers, c.CreatedAt, c.Seq}
	if c.OrderBy != "" {
		l = append(l, c.OrderBy)
	}
	return l
}

// Key returns the SQL expression of a row's ordering key (event.Event.Key)
// on table alias (none when empty): the order column's text unless it is
// NULL or empty, else the aggregate id.
func (c Columns) Key(alias string) string {
	if alias != "" {
		alias += "."
	}
	if c.OrderBy == "" {
		return alias + quote(c.AggregateID)
	}
	return fmt.Sprintf("coalesce(nullif(%s%s::text, ''), %s%s)", alias, quote(c.OrderBy), alias, quote(c.AggregateID))
}

// Quoted returns the column names in contract order, quoted and joined by
// ", ", prefixed with alias and a dot when alias is not empty.
func (c Columns) Quoted(alias string) string {
	cols := c.List()
	for i, n := range cols {
		cols[i] = quote(n)
		if alias != "" {
			cols[i] = alias + "." + cols[i]
		}
	}
	return strings.Join(cols, ", ")
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// Layout is every table the relay touches. The zero value names nothing:
// set at least Outbox, Cols and DeadLetter; Archive is needed only with
// archive.mode move.
type Layout struct {
	Outbox     Name
	Cols       Columns
	DeadLetter Name
	Archive    Name
}

// DefaultLayout returns the layout of the documented tables in schema
// public: outbox, its columns under their documented names,
// outbox_dead_letter and outbox_archive, the defaults of outbox.table,
// dead_letter.table and archive.table.
func DefaultLayout() Layout {
	return Layout{Outbox: Name{Schema: "public", Name: "outbox"}, Cols: DefaultColumns(),
		DeadLetter: Name{Schema: "public", Name: "outbox_dead_letter"},
		Archive:    Name{Schema: "public", Name: "outbox_archive"}}
}

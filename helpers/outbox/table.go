package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the outbox table of the package-level functions and of
// New with an empty Options.Table.
const DefaultTable = "public.outbox"

// MaxBatch is the most events WriteMany writes: one statement carries at
// most 65535 parameters and each event takes six.
const MaxBatch = 65535 / 6

// columns are the contract's column names, the keys of a column mapping.
var columns = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "created_at", "seq"}

// written are the columns Write fills, in argument order; created_at and
// seq take their defaults.
var written = columns[:6]

// Options describe an outbox table other than the contract's public.outbox.
// The zero value describes that table.
type Options struct {
	// Table is "name" or "schema.name", as the relay's outbox.table; a name
	// without a schema is in public. Empty means DefaultTable.
	Table string
	// Columns renames columns, as the relay's outbox.columns: keys are
	// contract names (id, aggregate_type, aggregate_id, event_type, payload,
	// headers, created_at, seq), values the table's column names. Missing
	// keys keep the contract name.
	Columns map[string]string
	// BinaryPayload declares a bytea payload column. Payloads are sent as
	// text by default, which jsonb, json and text columns take with any pgx
	// query mode and any database/sql driver; a bytea column needs them sent
	// as bytes instead, or text input would interpret backslashes.
	BinaryPayload bool
}

// Table is an outbox table with its column names. It is immutable and safe
// for concurrent use.
type Table struct {
	ident  string // the quoted table name
	insert string // INSERT INTO table (columns) VALUES
	binary bool   // send payloads as []byte
}

// New returns the outbox table that o describes. Identifiers are always
// quoted.
func New(o Options) (*Table, error) {
	ident, err := parseTable(o.Table)
	if err != nil {
		return nil, err
	}
	for k, v := range o.Columns {
		if !slices.Contains(columns, k) {
			return nil, fmt.Errorf("outbox: unknown column %q in Columns (expected one of %s)", k, strings.Join(columns, ", "))
		}
		if v == "" {
			return nil, fmt.Errorf("outbox: empty column name for %q in Columns", k)
		}
	}
	names := make([]string, len(written))
	for i, c := range written {
		names[i] = pgx.Identifier{cmp.Or(o.Columns[c], c)}.Sanitize()
	}
	t := &Table{ident: ident.Sanitize(), binary: o.BinaryPayload}
	t.insert = fmt.Sprintf("INSERT INTO %s (%s) VALUES ", t.ident, strings.Join(names, ", "))
	return t, nil
}

// parseTable splits "schema.name" at the first dot, as the relay does; a
// name without a schema is in public.
func parseTable(table string) (pgx.Identifier, error) {
	table = cmp.Or(table, DefaultTable)
	schema, name, ok := strings.Cut(table, ".")
	if !ok {
		schema, name = "public", table
	}
	if schema == "" || name == "" {
		return nil, fmt.Errorf("outbox: table %q: want name or schema.name", table)
	}
	return pgx.Identifier{schema, name}, nil
}

// Write inserts e with db, usually the transaction of the business write,
// and returns the event's id in canonical text form. The row becomes visible
// to the relay when that transaction commits; a rollback discards it. An
// invalid event returns an error wrapping ErrInvalidEvent and writes nothing.
// When ctx carries an OpenTelemetry span context and e.Headers has no
// traceparent, the row's headers get the span's traceparent and tracestate
// (W3C Trace Context), which the relay forwards to the broker.
func (t *Table) Write(ctx context.Context, db Execer, e Event) (string, error) {
	ids, err := t.WriteMany(ctx, db, e)
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// WriteMany inserts events with db in one statement, all or none, and
// returns their ids in order. Ids it generates increase in slice order, and
// the rows take seq values in slice order. It validates every event before
// writing any; an invalid one returns an error naming its index and wrapping
// ErrInvalidEvent. No events write nothing; more than MaxBatch is an error.
// Each event gets the trace context of ctx as Write describes.
func (t *Table) WriteMany(ctx context.Context, db Execer, events ...Event) ([]string, error) {
	if len(events) > MaxBatch {
		return nil, fmt.Errorf("outbox: %d events in one statement, more than MaxBatch (%d)", len(events), MaxBatch)
	}
	if len(events) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(events)*len(written))
	ids := make([]string, len(events))
	for i, e := range events {
		e.Headers = traceHeaders(ctx, e.Headers)
		a, err := e.args(t.binary)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d: %w", i, err)
		}
		ids[i] = a[0].(string)
		args = append(args, a...)
	}
	if _, err := db.Exec(ctx, t.statement(len(events)), args...); err != nil {
		return nil, fmt.Errorf("outbox: insert into %s: %w", t.ident, err)
	}
	return ids, nil
}

// statement returns the INSERT of n events.
func (t *Table) statement(n int) string {
	var b strings.Builder
	b.WriteString(t.insert)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j := range written {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("$" + strconv.Itoa(i*len(written)+j+1))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// Package schema knows the relay's tables: the outbox (with its column
// mapping), the dead-letter table and the objects `relay init` creates. Every
// identifier it puts into SQL is quoted.
package schema

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// Querier is what the package needs of a pgx connection, pool or
// transaction.
type Querier = table.Querier

// Table is a schema-qualified table name.
type Table = table.Name

// sibling returns a quoted object name in t's schema made of t's name and suffix.
func sibling(t Table, suffix string) string {
	return pgx.Identifier{t.Schema, derived(t.Name, suffix)}.Sanitize()
}

// maxName is PostgreSQL's identifier limit in bytes.
const maxName = 63

// derived returns the name of an object derived from name, name+suffix.
// When that exceeds maxName, name is cut short and followed by a hash of
// all of it, so the suffix survives and the objects of two tables, or two
// objects of one table, never share a name.
func derived(name, suffix string) string {
	if len(name)+len(suffix) <= maxName {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return rowtext.Prefix(name, maxName-len(tag)-len(suffix)) + tag + suffix
}

// Columns are the outbox's column names after the config's remapping.
type Columns = table.Columns

// Q quotes one column name.
func Q(name string) string { return pgx.Identifier{name}.Sanitize() }

// Layout is every table the relay touches: the public table.Layout, with
// the methods of this package (DDL, inspection, dead-letter queries).
// Convert between the two with Layout(l) and table.Layout(l).
type Layout table.Layout

// NotifyChannel is the channel the insert trigger notifies and poll capture
// listens on.
func (l Layout) NotifyChannel() string {
	return derived("relay_"+l.Outbox.Schema+"_"+l.Outbox.Name, "")
}

// Info is what Inspect learned about an existing outbox table.
type Info struct {
	// Types maps each mapped column name to its SQL type (format_type).
	Types map[string]string
	// ContentType follows from the payload column's type.
	ContentType string
	// SeqSequence is the regclass text of the sequence behind seq, or empty.
	SeqSequence string
	// Missing lists the mapped columns among headers, created_at and seq
	// that the table lacks, which only InspectWAL accepts; they are not in
	// Types.
	Missing []string
	// Partitions are the quoted partitions of archive mode partition's
	// ring outbox in the order of their values, once InspectRing found
	// them (see Layout.RingInfo); Inspect leaves them empty.
	Partitions []string
}

// Lacks reports whether the outbox table lacks column col (see Missing).
func (i Info) Lacks(col string) bool { return slices.Contains(i.Missing, col) }

// ErrNoOutbox is returned by Inspect when the outbox table does not exist.
var ErrNoOutbox = errors.New("outbox table does not exist")

// InspectSource is Inspect for a capture source (InspectWAL with wal): a
// missing outbox table and a seq column without a sequence are permanent
// errors (fault.AsPermanent).
func InspectSource(ctx context.Context, q Querier, l Layout, wal bool) (Info, error) {
	info, err := inspect(ctx, q, l, wal)
	if err != nil {
		if errors.Is(err, ErrNoOutbox) {
			err = fault.AsPermanent(err)
		}
		return Info{}, err
	}
	if info.SeqSequence == "" && !info.Lacks(l.Cols.Seq) {
		return Info{}, fault.AsPermanent(fmt.Errorf("outbox table %s: column %s has no sequence (declare it GENERATED ALWAYS AS IDENTITY)",
			l.Outbox, l.Cols.Seq))
	}
	return info, nil
}

// addable holds, by index in Columns.List, the definitions of the
// contract columns an application's inserts need not name (headers,
// created_at, seq), which a table made for another relay, such as
// Debezium's outbox table, may lack; empty for the others.
var addable = [...]string{5: "jsonb", 6: "timestamptz NOT NULL DEFAULT now()", 7: "bigint GENERATED ALWAYS AS IDENTITY"}

// Inspect checks that the outbox table exists with every mapped column and a
// supported payload type. Poll capture needs them all; see InspectWAL.
func Inspect(ctx context.Context, q Querier, l Layout) (Info, error) {
	return inspect(ctx, q, l, false)
}

// InspectFor is Inspect, or with wal set the inspection for wal capture,
// which does without the headers, created_at and seq columns (a table made
// for Debezium lacks them): those the table lacks are listed in
// Info.Missing rather than failing.
func InspectFor(ctx context.Context, q Querier, l Layout, wal bool) (Info, error) {
	return inspect(ctx, q, l, wal)
}

func inspect(ctx context.Context, q Querier, l Layout, wal bool) (Info, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, l.Outbox.Ident()).Scan(&exists); err != nil {
		return Info{}, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	if !exists {
		return Info{}, fmt.Errorf("%w: %s (create it with `relay init` or by hand, see docs/reference.md)", ErrNoOutbox, l.Outbox)
	}
	info := Info{Types: map[string]string{}}
	rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, l.Outbox.Ident())
	if err != nil {
		return Info{}, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return Info{}, err
		}
		info.Types[name] = typ
	}
	if err := rows.Err(); err != nil {
		return Info{}, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	for i, c := range l.Cols.List() {
		def := ""
		if i < len(addable) {
			def = addable[i]
		}
		if _, ok := info.Types[c]; !ok && c == l.Cols.OrderBy {
			return Info{}, fmt.Errorf("outbox table %s has no column %q, which outbox.order_by names", l.Outbox, c)
		} else if !ok && def != "" && wal {
			info.Missing = append(info.Missing, c)
		} else if !ok && def != "" {
			return Info{}, fmt.Errorf("outbox table %s has no column %q: add it (ALTER TABLE %s ADD COLUMN %s %s; inserts need not name it), or map it with outbox.columns",
				l.Outbox, c, l.Outbox.Ident(), Q(c), def)
		} else if !ok {
			return Info{}, fmt.Errorf("outbox table %s has no column %q (map it with outbox.columns)", l.Outbox, c)
		}
	}
	if info.ContentType, err = contentType(info.Types[l.Cols.Payload]); err != nil {
		return Info{}, fmt.Errorf("outbox table %s column %s: %w", l.Outbox, l.Cols.Payload, err)
	}
	if info.Lacks(l.Cols.Seq) {
		return info, nil
	}
	var seq *string
	if err := q.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, $2)`, l.Outbox.Ident(), l.Cols.Seq).Scan(&seq); err != nil {
		return Info{}, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	if seq != nil {
		info.SeqSequence = *seq
	}
	return info, nil
}

func contentType(sqlType string) (string, error) {
	switch sqlType {
	case "jsonb", "json":
		return event.ContentTypeJSON, nil
	case "text", "character varying":
		return event.ContentTypeText, nil
	case "bytea":
		return event.ContentTypeBinary, nil
	}
	return "", fmt.Errorf("payload type %s is not supported (use jsonb, json, text or bytea)", sqlType)
}

package schema

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxrelay/relay/fault"
)

// contractTypes are the outbox column types of docs/reference.md, in Columns.List
// order.
var contractTypes = []string{"uuid", "text", "text", "text", "jsonb", "jsonb", "timestamp with time zone", "bigint"}

// CreateOutbox returns the statement creating the outbox table of docs/reference.md
// when it is missing, with the order column (Columns.OrderBy) as a
// nullable text column when one is set.
func (l Layout) CreateOutbox() string {
	return l.createOutbox("uuid PRIMARY KEY", "bigint GENERATED ALWAYS AS IDENTITY", "")
}

// createOutbox returns the statement of CreateOutbox with the definitions
// id and seq of those columns, followed by tail.
func (l Layout) createOutbox(id, seq, tail string) string {
	c := l.Cols
	order := ""
	if c.OrderBy != "" {
		order = ",\n  " + Q(c.OrderBy) + " text"
	}
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
  %s %s,
  %s text NOT NULL,
  %s text NOT NULL,
  %s text NOT NULL,
  %s jsonb NOT NULL,
  %s jsonb,
  %s timestamptz NOT NULL DEFAULT now(),
  %s %s%s
)%s`, l.Outbox.Ident(), Q(c.ID), id, Q(c.AggregateType), Q(c.AggregateID), Q(c.EventType),
		Q(c.Payload), Q(c.Headers), Q(c.CreatedAt), Q(c.Seq), seq, order, tail)
}

// orderColumnStep returns the init step adding the order column
// (Columns.OrderBy) to table t, which exists without it because it was
// created before outbox.order_by was set; nil when no order column is set.
func (l Layout) orderColumnStep(what string, t Table, types map[string]string) []Step {
	c := l.Cols.OrderBy
	if c == "" {
		return nil
	}
	typ := types[c]
	if typ == "" {
		typ = "text"
	}
	return []Step{{Object: fmt.Sprintf("column %s of %s %s", c, what, t),
		Probe:  fmt.Sprintf(`SELECT to_regclass(%s) IS NOT NULL AND NOT %s`, Literal(t.Ident()), hasColumn(t, c)),
		Create: []string{fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s`, t.Ident(), Q(c), typ)}}}
}

// hasColumn returns the SQL condition that table t has column c.
func hasColumn(t Table, c string) string {
	return fmt.Sprintf(`EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND attnum > 0 AND NOT attisdropped)`,
		Literal(t.Ident()), Literal(c))
}

// ensureOrderColumn fails, permanently, when table t exists without the
// order column (Columns.OrderBy), which its rows must carry, naming the
// statement that adds it.
func ensureOrderColumn(ctx context.Context, q Querier, l Layout, what string, t Table, types map[string]string) error {
	for _, s := range l.orderColumnStep(what, t, types) {
		var missing bool
		if err := q.QueryRow(ctx, s.Probe).Scan(&missing); err != nil {
			return fmt.Errorf("inspect %s: %w", s.Object, err)
		}
		if missing {
			return fault.AsPermanent(fmt.Errorf("%s has no column %s, which outbox.order_by names and dead letters and archived rows keep: run `relay init`, or %s",
				t, Q(l.Cols.OrderBy), s.Create[0]))
		}
	}
	return nil
}

// pollIndex serves the poll query (WHERE seq <= $1 ORDER BY seq). It is
// UNIQUE, which lets poll capture raise its watermark over visible seqs
// without reading pg_locks (capture/internal/claim): an application's row
// with an explicit seq cannot then take the seq of an open writer. An
// existing non-unique index of that name is kept; claims then read the
// open writers on every poll.
func (l Layout) pollIndex() index {
	return index{table: l.Outbox, suffix: "_relay_seq_idx", def: "(" + Q(l.Cols.Seq) + ")", unique: true}
}

// CreatePollIndex returns the statement creating the index that serves the
// poll query, CONCURRENTLY (run it outside a transaction).
func (l Layout) CreatePollIndex() string { return l.pollIndex().create(true) }

// InitSteps returns what `relay init` creates when missing, in order, on an
// outbox whose column types are types (nil: the contract's): the outbox
// table, the poll index, the notify trigger (notify) or its removal, the
// dead-letter table with its indexes, and what archive mode archiveMode
// needs. Indexes are built CONCURRENTLY. An outbox without a seq column
// (types without it, see InspectFor) gets no poll index.
func (l Layout) InitSteps(notify bool, archiveMode string, types map[string]string) []Step {
	steps := []Step{tableStep("outbox table", l.Outbox, l.CreateOutbox())}
	if _, ok := types[l.Cols.Seq]; ok || types == nil {
		steps = append(steps, l.pollIndex().step())
	}
	return append(steps, l.commonSteps(notify, archiveMode, types)...)
}

// commonSteps are the steps of InitSteps after the outbox table and its
// poll index: the notify trigger or its removal, the dead-letter table
// with its indexes, and what archive mode archiveMode needs.
func (l Layout) commonSteps(notify bool, archiveMode string, types map[string]string) []Step {
	steps := []Step{l.notifyStep(notify)}
	dl := l.CreateDeadLetter(types)
	steps = append(steps, tableStep("dead-letter table", l.DeadLetter, dl[0]))
	steps = append(steps, l.orderColumnStep("dead-letter table", l.DeadLetter, types)...)
	for _, ix := range l.deadLetterIndexes() {
		steps = append(steps, ix.step())
	}
	steps = append(steps, l.dropLegacyAggregateIndex())
	return append(steps, l.archiveSteps(archiveMode, types)...)
}

// notifyStep installs the notify trigger when it is missing (notify), or
// removes it when present (not notify).
func (l Layout) notifyStep(notify bool) Step {
	name := derived(l.Outbox.Name, "_relay_notify")
	exists := fmt.Sprintf(`EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname = %s)`,
		Literal(l.Outbox.Ident()), Literal(name))
	s := Step{Object: fmt.Sprintf("insert notify trigger %s on %s", name, l.Outbox)}
	if notify {
		s.Probe, s.Create = "SELECT NOT "+exists, l.CreateNotifyTrigger()
	} else {
		s.Probe, s.Create, s.Drop = "SELECT "+exists, l.DropNotifyTrigger(), true
	}
	return s
}

// CreateNotifyTrigger returns the statements installing a statement-level
// insert trigger that notifies NotifyChannel, so poll capture wakes at once.
// Postgres folds identical notifications of one transaction into one.
func (l Layout) CreateNotifyTrigger() []string {
	fn := sibling(l.Outbox, "_relay_notify")
	body := fmt.Sprintf("\nBEGIN\n  PERFORM pg_notify(%s, '');\n  RETURN NULL;\nEND\n", Literal(l.NotifyChannel()))
	return []string{
		fmt.Sprintf(`CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS %s`, fn, Literal(body)),
		fmt.Sprintf(`CREATE OR REPLACE TRIGGER %s AFTER INSERT ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()`,
			Q(derived(l.Outbox.Name, "_relay_notify")), l.Outbox.Ident(), fn),
	}
}

// DropNotifyTrigger returns the statements removing the trigger of
// CreateNotifyTrigger.
func (l Layout) DropNotifyTrigger() []string {
	return []string{
		fmt.Sprintf(`DROP TRIGGER IF EXISTS %s ON %s`, Q(derived(l.Outbox.Name, "_relay_notify")), l.Outbox.Ident()),
		fmt.Sprintf(`DROP FUNCTION IF EXISTS %s()`, sibling(l.Outbox, "_relay_notify")),
	}
}

// CreateDeadLetter returns the statements creating the dead-letter table
// when it is missing, with its indexes (plain: the table is new): the
// outbox columns with the outbox's types (types maps column name to type;
// the contract's types are used for missing entries), all nullable so a
// malformed row can be kept, plus the failure columns of
// docs/reference.md.
func (l Layout) CreateDeadLetter(types map[string]string) []string {
	cols := append(l.typedColumns(types),
		"  error text", "  error_class text", "  attempts int",
		"  first_failed_at timestamptz", "  last_failed_at timestamptz",
		"  dead_lettered_at timestamptz NOT NULL DEFAULT now()")
	stmts := []string{fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n%s\n)", l.DeadLetter.Ident(), strings.Join(cols, ",\n"))}
	for _, ix := range l.deadLetterIndexes() {
		stmts = append(stmts, ix.create(false))
	}
	return stmts
}

// deadLetterIndexes are the dead-letter table's indexes: on the event id,
// and on the hash of the aggregate id (hashtext, KeyHash without an order
// column), which serves the park check of dead_letter.park_aggregate, the
// dlq commands' --aggregate (both through SameKey or the same hashtext
// condition) and the batches of a redrive (ranges of KeyHash). It holds a
// 4-byte hash, so it takes every value the outbox takes; a btree on the
// value refused a dead letter whose aggregate id did not fit in an index
// row (about 2.7 kB after compression), and with it the archive of its
// whole batch.
func (l Layout) deadLetterIndexes() []index {
	return []index{
		{table: l.DeadLetter, suffix: "_id_idx", def: "(" + Q(l.Cols.ID) + ")"},
		{table: l.DeadLetter, suffix: aggregateIndex, def: "(hashtext(" + Q(l.Cols.AggregateID) + "))"},
	}
}

// aggregateIndex is the suffix of the dead-letter table's index on the
// hash of the aggregate id (see deadLetterIndexes).
const aggregateIndex = "_aggregate_hash_idx"

// legacyAggregateIndex is the suffix of the btree index on the aggregate id
// that earlier releases created on the dead-letter table; `relay init`
// replaces it with the index on the hash of deadLetterIndexes.
const legacyAggregateIndex = "_aggregate_idx"

// dropLegacyAggregateIndex returns the init step removing the btree index
// on the aggregate id that earlier releases created, once the index
// that replaces it is built (the step before it): DROP INDEX CONCURRENTLY,
// which does not block the application's writes.
func (l Layout) dropLegacyAggregateIndex() Step {
	old := sibling(l.DeadLetter, legacyAggregateIndex)
	return Step{Object: fmt.Sprintf("btree index %s on %s (replaced by the index on the hash %s)",
		derived(l.DeadLetter.Name, legacyAggregateIndex), l.DeadLetter, derived(l.DeadLetter.Name, aggregateIndex)),
		Probe: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND indrelid = to_regclass(%s))`,
			Literal(old), Literal(l.DeadLetter.Ident())),
		Create: []string{"DROP INDEX CONCURRENTLY IF EXISTS " + old},
		Drop:   true}
}

// typedColumns returns the outbox columns with their types, nullable, one
// "  name type" per entry; types as for CreateDeadLetter.
func (l Layout) typedColumns(types map[string]string) []string {
	var cols []string
	for i, c := range l.Cols.List() {
		cols = append(cols, fmt.Sprintf("  %s %s", Q(c), columnType(i, c, types)))
	}
	return cols
}

// DeadLetterTypes returns the type of every column of Columns.List in the
// dead-letter table that CreateDeadLetter(types) creates.
func (l Layout) DeadLetterTypes(types map[string]string) map[string]string {
	out := make(map[string]string, len(types))
	for i, c := range l.Cols.List() {
		out[c] = columnType(i, c, types)
	}
	return out
}

// columnType returns the type of column name, the i-th of Columns.List:
// types[name], else the contract's, else text.
func columnType(i int, name string, types map[string]string) string {
	switch t := types[name]; {
	case t != "":
		return t
	case i < len(contractTypes):
		return contractTypes[i]
	}
	return "text"
}

// EnsureDeadLetter creates the dead-letter table when it is missing, with
// the column types of the existing outbox table described by info. It
// issues no DDL when the table exists; a role that may not create it gets a
// permanent error naming the table and `relay init`.
func EnsureDeadLetter(ctx context.Context, q Querier, l Layout, info Info) error {
	if err := ensureTable(ctx, q, "dead-letter table", l.DeadLetter, l.CreateDeadLetter(info.Types)); err != nil {
		return err
	}
	return ensureOrderColumn(ctx, q, l, "dead-letter table", l.DeadLetter, info.Types)
}

// Literal quotes s as an SQL string literal, like PostgreSQL's
// quote_literal: quotes doubled, and with a backslash the E” form with
// backslashes doubled, so the result means s whatever
// standard_conforming_strings is.
func Literal(s string) string {
	q := "'" + strings.ReplaceAll(s, "'", "''") + "'"
	if strings.Contains(s, `\`) {
		return "E" + strings.ReplaceAll(q, `\`, `\\`)
	}
	return q
}

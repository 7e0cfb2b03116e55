package schema

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetterFilter selects dead letters. Zero fields select everything.
type DeadLetterFilter struct {
	// IDs are event ids (message_ids).
	IDs []string
	// Aggregate is an aggregate_id.
	Aggregate string
	// OlderThan selects dead letters whose last failure is older than this.
	OlderThan time.Duration
	// After and Through, when set, narrow the selection to the ordering
	// keys (Columns.Key) whose hash (KeyHash) is greater than After and at
	// most Through: one batch of a redrive (see NextKeys), which holds all
	// dead letters of each of its keys. Dead letters without a key are
	// outside every such range.
	After, Through *int32
}

// KeyHash returns the SQL expression of the hash of the ordering key
// (Columns.Key) of the dead-letter or outbox row alias: the expression the
// dead-letter table's index on the aggregate id serves when no order column
// is set (see deadLetterIndexes).
func (l Layout) KeyHash(alias string) string { return "hashtext(" + l.Cols.Key(alias) + ")" }

// SameKey returns the condition that rows a and b (aliases) of the outbox
// or dead-letter table have the same ordering key, comparing KeyHash
// first so that the dead-letter table's index serves it.
func (l Layout) SameKey(a, b string) string {
	return fmt.Sprintf("%s = %s AND %s = %s", l.KeyHash(a), l.KeyHash(b), l.Cols.Key(a), l.Cols.Key(b))
}

// Empty reports whether f selects every dead letter.
func (f DeadLetterFilter) Empty() bool {
	return len(f.IDs) == 0 && f.Aggregate == "" && f.OlderThan <= 0
}

// where returns the filter's condition on the dead-letter table and its
// arguments, numbered from $1.
func (l Layout) where(f DeadLetterFilter) (string, []any) {
	var ids []string
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	var older *time.Duration
	if f.OlderThan > 0 {
		older = &f.OlderThan
	}
	cond := fmt.Sprintf(`($1::text[] IS NULL OR %[1]s::text = ANY($1))
		AND ($2 = '' OR hashtext(%[2]s) = hashtext($2) AND %[2]s = $2)
		AND ($3::interval IS NULL OR last_failed_at < now() - $3::interval)
		AND ($4::int IS NULL OR %[3]s > $4::int)
		AND ($5::int IS NULL OR %[3]s <= $5::int)`,
		Q(l.Cols.ID), Q(l.Cols.AggregateID), l.KeyHash(""))
	return cond, []any{ids, f.Aggregate, older, f.After, f.Through}
}

// CutChars is how many characters a dead letter keeps of a long value of
// a text column other than the payload and headers when the dead-letter
// table refused the row as it was (see DeadLetterRow).
const CutChars = 200

// DeadLetterRow returns the select list of a dead-letter insert: the
// outbox columns in Columns.List order, each given by value (its SQL
// expression, from its position in that list and its name), then the
// error, errExpr. With cut, a value of the aggregate type, aggregate id,
// event type or order column whose type (types; the contract's for missing
// entries) is text or varchar keeps its first CutChars characters when it
// is longer, and the error ends naming the columns cut and their lengths:
// the form of a dead letter that the dead-letter table refused as it was
// (an index or constraint of the table that cannot hold a value, see
// pgerr.RowValue).
func (l Layout) DeadLetterRow(value func(i int, name string) string, errExpr string, types map[string]string, cut bool) string {
	c := l.Cols
	long := map[string]bool{c.AggregateType: true, c.AggregateID: true, c.EventType: true}
	if c.OrderBy != "" {
		long[c.OrderBy] = true
	}
	var cols, notes []string
	for i, name := range c.List() {
		v := value(i, name)
		if t := columnType(i, name, types); cut && long[name] && (t == "text" || strings.HasPrefix(t, "character varying")) {
			notes = append(notes, fmt.Sprintf(`CASE WHEN length(%[1]s) > %[2]d THEN format('%%s (%%s characters)', %[3]s::text, length(%[1]s)) END`,
				v, CutChars, Literal(name)))
			v = fmt.Sprintf("left(%s, %d)", v, CutChars)
		}
		cols = append(cols, v)
	}
	if len(notes) > 0 {
		errExpr = fmt.Sprintf(`concat_ws(' ', %s, '[cut to their first %d characters: ' || nullif(concat_ws(', ', %s), '') || ']')`,
			errExpr, CutChars, strings.Join(notes, ", "))
	}
	return strings.Join(append(cols, errExpr), ", ")
}

// RefusedError returns the error a dead letter keeps when the dead-letter
// table refused its row as it was with err and took it as DeadLetterRow
// cuts it: the refusal first, so that cutting a long message (see
// internal/rowtext) keeps it, then cause, the event's failure.
func RefusedError(cause string, err error) string {
	return "the dead-letter table refused the row as it was (" + err.Error() + "), so long values are cut; the event failed with: " + cause
}

// DeadLetter is one row of the dead-letter table.
type DeadLetter struct {
	ID, AggregateType, AggregateID, EventType string
	Error, ErrorClass                         string
	Attempts                                  int
	LastFailed                                time.Time
}

// ListDeadLetters returns up to limit dead letters matching f, oldest
// failure first.
func (l Layout) ListDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	cond, args := l.where(f)
	c := l.Cols
	rows, err := q.Query(ctx, fmt.Sprintf(`SELECT %s::text, coalesce(%s, ''), coalesce(%s, ''), coalesce(%s, ''),
		coalesce(error, ''), coalesce(error_class, ''), coalesce(attempts, 0), coalesce(last_failed_at, dead_lettered_at)
		FROM %s WHERE %s ORDER BY last_failed_at, %s LIMIT %d`,
		Q(c.ID), Q(c.AggregateType), Q(c.AggregateID), Q(c.EventType), l.DeadLetter.Ident(), cond, Q(c.Seq), limit), args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters in %s: %w", l.DeadLetter, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.AggregateType, &d.AggregateID, &d.EventType, &d.Error, &d.ErrorClass, &d.Attempts, &d.LastFailed)
		return d, err
	})
}

// Column is one column of a row as PostgreSQL prints it.
type Column struct {
	// Name is the column's name and Type its type, as format_type names it.
	Name, Type string
	// Value is the column's text form (bytea as \x and hex digits, json and
	// jsonb as JSON text), nil for NULL. It holds the bytes as stored:
	// in a SQL_ASCII database they need not be UTF-8.
	Value *string
}

// ShowDeadLetters returns every column of up to limit dead letters
// matching f, in table order, oldest failure first.
func (l Layout) ShowDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, limit int) ([][]Column, error) {
	rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, l.DeadLetter.Ident())
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", l.DeadLetter, err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Column, error) {
		var c Column
		return c, r.Scan(&c.Name, &c.Type)
	})
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", l.DeadLetter, err)
	}
	list := make([]string, len(cols))
	for i, c := range cols {
		list[i] = Q(c.Name) + "::text"
	}
	cond, args := l.where(f)
	rows, err = q.Query(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY last_failed_at, %s LIMIT %d`,
		strings.Join(list, ", "), l.DeadLetter.Ident(), cond, Q(l.Cols.Seq), limit), args...)
	if err != nil {
		return nil, fmt.Errorf("read dead letters in %s: %w", l.DeadLetter, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]Column, error) {
		values := make([]*string, len(cols))
		dest := make([]any, len(cols))
		for i := range values {
			dest[i] = &values[i]
		}
		row := slices.Clone(cols)
		if err := r.Scan(dest...); err != nil {
			return nil, err
		}
		for i := range row {
			row[i].Value = values[i]
		}
		return row, nil
	})
}

// CountDeadLetters returns how many dead letters match f.
func (l Layout) CountDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter) (int64, error) {
	cond, args := l.where(f)
	var n int64
	if err := q.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s`, l.DeadLetter.Ident(), cond), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters in %s: %w", l.DeadLetter, err)
	}
	return n, nil
}

// NextKeys returns the bound of the next batch of a redrive: the greatest
// of the first keys hashes of ordering keys (KeyHash, in order) of the dead
// letters matching f, which Through must be nil in. ok is false when no
// dead letter with a key is left. Keys whose hashes collide fall into one
// batch, which may then hold a few more than keys keys.
func (l Layout) NextKeys(ctx context.Context, q Querier, f DeadLetterFilter, keys int) (through int32, ok bool, err error) {
	cond, args := l.where(f)
	var bound *int32
	err = q.QueryRow(ctx, fmt.Sprintf(`SELECT max(h) FROM (SELECT DISTINCT %[1]s AS h FROM %[2]s WHERE %[3]s AND %[4]s IS NOT NULL ORDER BY h LIMIT %[5]d) s`,
		l.KeyHash(""), l.DeadLetter.Ident(), cond, l.Cols.Key(""), keys), args...).Scan(&bound)
	if err != nil {
		return 0, false, fmt.Errorf("find the next dead letters to redrive in %s: %w", l.DeadLetter, err)
	}
	if bound == nil {
		return 0, false, nil
	}
	return *bound, true, nil
}

// Redrive moves the dead letters matching f back into the outbox with
// their original ids, so consumers still deduplicate them, in their
// original seq order. A dead letter whose id is already in the outbox is
// only removed; the row it was dead-lettered from, which archive mode
// partition leaves in the outbox until its partition is truncated, is
// deleted first, so that it neither passes for a redriven copy nor
// collides with the copy's id in its partition. With resequence (dead_letter.park_aggregate), the rows their
// aggregates left parked in the outbox are re-inserted after them, so they
// follow the redriven events in seq (and WAL) order. q should be a
// transaction. It returns how many rows went back into the outbox
// (redriven) and how many dead letters it removed.
func (l Layout) Redrive(ctx context.Context, q Querier, f DeadLetterFilter, resequence bool) (redriven, removed int64, err error) {
	info, err := InspectFor(ctx, q, l, true) // an outbox lacking a relay column gets the others
	if err != nil {
		return 0, 0, err
	}
	cond, args := l.where(f)
	c := l.Cols
	var ring bool
	if err := q.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass`, l.Outbox.Ident()).Scan(&ring); err != nil {
		return 0, 0, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	if ring && !info.Lacks(c.Seq) {
		if _, err := q.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s WHERE (%[2]s, %[3]s) IN (SELECT %[2]s, %[3]s FROM %[4]s WHERE %[5]s)`,
			l.Outbox.Ident(), Q(c.ID), Q(c.Seq), l.DeadLetter.Ident(), cond), args...); err != nil {
			return 0, 0, fmt.Errorf("remove the dead-lettered rows left in %s: %w", l.Outbox, err)
		}
	}
	var ids, aggs []string
	err = q.QueryRow(ctx, fmt.Sprintf(`WITH moved AS (
		DELETE FROM %[1]s WHERE %[2]s RETURNING *
	), latest AS (
		SELECT DISTINCT ON (%[3]s) * FROM moved ORDER BY %[3]s, dead_lettered_at DESC
	), inserted AS (
		INSERT INTO %[4]s (%[5]s)
		SELECT %[5]s FROM latest
		WHERE NOT EXISTS (SELECT 1 FROM %[4]s o WHERE o.%[3]s = latest.%[3]s)
		ORDER BY %[6]s
		RETURNING %[3]s::text AS id, %[7]s AS key
	)
	SELECT (SELECT count(*) FROM moved), coalesce(array_agg(id), '{}'), coalesce(array_agg(key), '{}') FROM inserted`,
		l.DeadLetter.Ident(), cond, Q(c.ID), l.Outbox.Ident(), l.insertColumns(info.Missing...), Q(c.Seq), c.Key("")), args...).Scan(&removed, &ids, &aggs)
	if err != nil {
		return 0, 0, fmt.Errorf("redrive dead letters from %s into %s: %w", l.DeadLetter, l.Outbox, err)
	}
	if resequence && len(ids) > 0 {
		if err := l.resequence(ctx, q, ids, aggs); err != nil {
			return 0, 0, err
		}
	}
	return int64(len(ids)), removed, nil
}

// resequence re-inserts the outbox rows of ordering keys keys (see
// Columns.Key), other than ids, after everything else, keeping their ids
// and relative order (without seq, see Info.Missing, that of their
// inserting transactions).
func (l Layout) resequence(ctx context.Context, q Querier, ids, keys []string) error {
	info, err := InspectFor(ctx, q, l, true)
	if err != nil {
		return err
	}
	c := l.Cols
	order := Q(c.Seq)
	if info.Lacks(c.Seq) {
		order = "age(xmin) DESC, ctid"
	}
	_, err = q.Exec(ctx, fmt.Sprintf(`WITH moved AS (
		DELETE FROM %[1]s WHERE %[2]s = ANY($1) AND %[3]s::text <> ALL($2) RETURNING *
	)
	INSERT INTO %[1]s (%[4]s) SELECT %[4]s FROM moved ORDER BY %[5]s`,
		l.Outbox.Ident(), c.Key(""), Q(c.ID), l.insertColumns(info.Missing...), order), keys, ids)
	if err != nil {
		return fmt.Errorf("re-sequence parked events in %s: %w", l.Outbox, err)
	}
	return nil
}

// insertColumns lists the outbox columns an INSERT sets: all but seq and
// the columns missing from the outbox.
func (l Layout) insertColumns(missing ...string) string {
	var cols []string
	for _, c := range l.Cols.List() {
		if c != l.Cols.Seq && !slices.Contains(missing, c) {
			cols = append(cols, Q(c))
		}
	}
	return strings.Join(cols, ", ")
}

// DropDeadLetters deletes the dead letters matching f and returns how many.
// With resequence (dead_letter.park_aggregate), the rows their aggregates
// left parked in the outbox are re-inserted after every other row, keeping
// their ids and relative order: a poller whose cursor already passed their
// old seq would otherwise publish the aggregate's next new event before
// them. q should be a transaction.
func (l Layout) DropDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, resequence bool) (int64, error) {
	cond, args := l.where(f)
	rows, err := q.Query(ctx, fmt.Sprintf(`DELETE FROM %s WHERE %s RETURNING %s::text, %s`,
		l.DeadLetter.Ident(), cond, Q(l.Cols.ID), l.Cols.Key("")), args...)
	if err != nil {
		return 0, fmt.Errorf("drop dead letters from %s: %w", l.DeadLetter, err)
	}
	var ids, aggs []string
	var id, agg string
	if _, err := pgx.ForEachRow(rows, []any{&id, &agg}, func() error {
		ids, aggs = append(ids, id), append(aggs, agg)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("drop dead letters from %s: %w", l.DeadLetter, err)
	}
	if resequence && len(ids) > 0 {
		if err := l.resequence(ctx, q, ids, aggs); err != nil {
			return 0, err
		}
	}
	return int64(len(ids)), nil
}

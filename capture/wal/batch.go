package wal

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
)

// batch is a run of consecutive outbox rows of the stream. It may span
// transactions and may end inside one.
type batch struct {
	src    *Source
	st     *stream
	events []*event.Event
	seqs   []int64 // parallel to events, for the dead-letter table
	// stored holds the ids as the outbox rows store them, of the events
	// whose stored id is not the canonical text of their ID; nil when none.
	// The archive and dead-letter statements match and copy the id as
	// stored.
	stored map[*event.Event]string
	bad    []*badRow
	// ack is the end LSN of the last transaction whose commit was received
	// after this batch's first row and before the next batch's, or 0. Once
	// this batch and every earlier one are archived, the slot may confirm
	// it. Guarded by st.mu.
	ack   pglogrepl.LSN
	done  bool     // archived; guarded by st.mu
	xids  []uint32 // the transactions of the batch's rows
	n     int      // rows when handed out; guarded by st.mu
	bytes int      // bytes of events (event.Event.Size) and bad rows; guarded by st.mu
	// heldTop is the greatest seq of the rows of held aggregates taken out
	// of the batch before it was handed out (see leaveHeld), or 0.
	heldTop int64
}

// leaveHeld takes the events of aggregates held in the outbox (see
// Source.Hold) out of the batch before it is handed out: they stay in the
// outbox, its Complete records them in the pending drain, and the drain
// after their Release publishes them. The pipeline would only leave them.
func (b *batch) leaveHeld() {
	if b.src.held.Len() == 0 {
		return
	}
	kept := 0
	for i, ev := range b.events {
		if b.src.held.Has(ev.Key()) {
			b.heldTop = max(b.heldTop, b.seqs[i])
			continue
		}
		b.events[kept], b.seqs[kept] = ev, b.seqs[i]
		kept++
	}
	clear(b.events[kept:])
	b.events, b.seqs = b.events[:kept], b.seqs[:kept]
}

func (b *batch) rows() int { return len(b.events) + len(b.bad) }

// Events returns the batch's events in commit order.
func (b *batch) Events() []*event.Event { return b.events }

// Complete archives the published rows (per Options.ArchiveMode), writes
// the dead ones, from the event values, to the dead-letter table and
// deletes them from the outbox, in one transaction, or, when a statement
// of it fails, row by row (see settleApart). Rows that are already gone
// (inserted and deleted in one transaction by the application) are no-ops.
// Each transaction takes at most archiveTimeout, whatever locks other
// sessions hold. Then the batch counts as archived for the slot's
// confirmed position. When archiving fails, the stream restarts from the
// confirmed position, so the batch's events still in the outbox are
// captured again.
func (b *batch) Complete(ctx context.Context, o capture.Outcome) error {
	if err := b.archive(ctx, o); err != nil {
		b.st.fail(fmt.Errorf("%w: %w", capture.ErrArchive, err))
		return err
	}
	b.st.archived(b)
	return nil
}

// Abandon leaves the batch unarchived: the slot's confirmed position stays
// before it, so its events are streamed again after a restart.
func (b *batch) Abandon(context.Context) {}

func (b *batch) archive(ctx context.Context, o capture.Outcome) error {
	if b.src.opts.MessagePrefix != "" || b.src.opts.ring() {
		return b.deadLetterMessages(ctx, o)
	}
	if err := b.recordLeft(ctx, o); err != nil {
		return err
	}
	published := make([]string, len(o.Published))
	for i, ev := range o.Published {
		published[i] = b.storedID(ev)
	}
	if len(o.Dead)+len(b.bad) == 0 {
		if len(published) == 0 {
			return nil
		}
		return b.src.arch.archive(ctx, published, b.xids)
	}
	wctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	err := waitVisible(wctx, b.src.opts.Pool, b.xids)
	cancel()
	if err != nil {
		return err
	}
	err = b.settle(ctx, o.Dead, b.bad, published, false)
	if err != nil && pgerr.Of(err) != nil && ctx.Err() == nil {
		err = b.settleApart(ctx, o.Dead, published)
	}
	if err != nil {
		return fmt.Errorf("archive %d rows and dead-letter %d: %w", len(published), len(o.Dead)+len(b.bad), err)
	}
	return nil
}

// deadLetterMessages settles a batch of the table-free outbox (see
// message.go) or of archive mode partition's ring outbox, whose rows stay
// until their partition is truncated (see truncate.go): nothing is
// archived, and the dead events and bad messages or rows are written from
// their values to the dead-letter table in one transaction of at most
// archiveTimeout, again with long values cut when the table refuses them
// as they are (see settleApart). A batch whose outcome leaves events (the
// pipeline holds none in these modes: the source is no capture.Holder)
// fails, so that the slot is not confirmed past them and they are
// streamed again.
func (b *batch) deadLetterMessages(ctx context.Context, o capture.Outcome) error {
	if left := o.Left(b.events); len(left) > 0 {
		return fmt.Errorf("%d outbox events left neither published nor dead-lettered; streaming them again", len(left))
	}
	if len(o.Dead)+len(b.bad) == 0 {
		return nil
	}
	err := b.insertDead(ctx, o.Dead, b.bad, false)
	if err != nil && pgerr.RowValue(err) && ctx.Err() == nil {
		refusal := err
		if err = b.insertDead(ctx, o.Dead, b.bad, true); err == nil {
			b.src.log.Warn("the dead-letter table refused rows as they were; it keeps them with their long values cut", "refusal", refusal.Error())
		}
	}
	if err != nil {
		return fmt.Errorf("dead-letter %d outbox events: %w", len(o.Dead)+len(b.bad), err)
	}
	return nil
}

// insertDead writes the dead events and bad rows to the dead-letter table
// from their values, in one transaction of at most archiveTimeout; cut as
// for settle.
func (b *batch) insertDead(ctx context.Context, dead []capture.DeadEvent, bad []*badRow, cut bool) error {
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, b.src.opts.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, txLimits, txLimit); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, b.src.sql.insertDead(cut), b.deadArgs(dead, bad)...)
		return err
	})
}

// settle runs, in one transaction of at most archiveTimeout, the
// dead-letter inserts of the dead events and bad rows, their deletion from
// the outbox and the archive of the rows with ids published; with cut,
// the inserts keep long values cut (schema.Layout.DeadLetterRow).
func (b *batch) settle(ctx context.Context, dead []capture.DeadEvent, bad []*badRow, published []string, cut bool) error {
	q := b.src.sql
	ids := make([]string, 0, len(dead)+len(bad))
	for _, d := range dead {
		ids = append(ids, b.storedID(d.Event))
	}
	for _, r := range bad {
		if r.vals[fID] != nil {
			ids = append(ids, *r.vals[fID])
		}
	}
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	return pgx.BeginFunc(ctx, b.src.opts.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, txLimits, txLimit); err != nil {
			return err
		}
		goneDead, goneBad, err := b.copyDead(ctx, tx, dead, bad, cut)
		if err != nil {
			return err
		}
		br := &pgx.Batch{}
		if len(goneDead)+len(goneBad) > 0 {
			br.Queue(q.insertDead(cut), b.deadArgs(goneDead, goneBad)...)
		}
		br.Queue(q.dropDead, ids)
		if len(published) > 0 {
			br.Queue(q.archive, published)
		}
		return tx.SendBatch(ctx, br).Close()
	})
}

// settleApart settles the rows of a batch whose transaction failed: the
// published rows through the archiver, then each dead event and bad row
// in a transaction of its own, which, when the dead-letter table refuses
// the row for its values (pgerr.RowValue: an index of an earlier release
// that cannot hold a long aggregate id, a bounded column), runs again
// keeping the row with its long values cut and the refusal in its error.
// A row that fails to settle thus holds back no other: the stream restarts
// and hands out again only the rows still in the outbox. It returns the
// first failure, nil when every row settled, and stops at a failure that
// says the next row would wait as long (pgerr.Stalled: a lock or
// statement timeout, the database out of reach).
func (b *batch) settleApart(ctx context.Context, dead []capture.DeadEvent, published []string) error {
	var first error
	if len(published) > 0 {
		first = b.src.arch.archive(ctx, published, b.xids)
	}
	keep := func(err error) bool {
		if first == nil {
			first = err
		}
		return !pgerr.Stalled(err) // else the next row would wait as long: it waits for the next stream
	}
	for _, d := range dead {
		one := []capture.DeadEvent{d}
		err := b.settle(ctx, one, nil, nil, false)
		if err != nil && pgerr.RowValue(err) {
			one[0].Err = schema.RefusedError(d.Err, err)
			err = b.settleCut(ctx, one, nil, err)
		}
		if !keep(err) {
			return err
		}
	}
	for _, r := range b.bad {
		one := []*badRow{r}
		err := b.settle(ctx, nil, one, nil, false)
		if err != nil && pgerr.RowValue(err) {
			cut := *r
			cut.err = schema.RefusedError(r.err, err)
			err = b.settleCut(ctx, nil, []*badRow{&cut}, err)
		}
		if !keep(err) {
			return err
		}
	}
	return first
}

// settleCut settles one dead event or bad row that the dead-letter table
// refused with refusal, keeping its long values cut.
func (b *batch) settleCut(ctx context.Context, dead []capture.DeadEvent, bad []*badRow, refusal error) error {
	if err := b.settle(ctx, dead, bad, nil, true); err != nil {
		return err
	}
	b.src.log.Warn("the dead-letter table refused a row as it was; it keeps the row with its long values cut", "refusal", refusal.Error())
	return nil
}

// recordLeft records, when o leaves events of b in the outbox (held for a
// broken destination, see capture.Holder) or leaveHeld took some out, that the slot's pending drain
// covers them, before the slot may be confirmed past them: they are
// published from the table when their destination works again, or after
// a restart.
func (b *batch) recordLeft(ctx context.Context, o capture.Outcome) error {
	left := o.Left(b.events)
	if len(left) == 0 && b.heldTop == 0 {
		return nil
	}
	top := b.heldTop
	for _, i := range left {
		top = max(top, b.seqs[i])
	}
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	if _, err := b.src.opts.Pool.Exec(ctx, b.src.sql.leave, top); err != nil {
		return fmt.Errorf("record %d rows left in the outbox for the drain: %w", len(left), err)
	}
	return nil
}

// copyDead copies the dead events and bad rows whose row is still in the
// outbox to the dead-letter table (with cut, keeping long values cut), from the table rather than from the
// values received, so that a large payload is not sent back to the server
// it came from. It returns the dead events and bad rows whose row is gone
// (the application inserted and deleted it in one transaction).
func (b *batch) copyDead(ctx context.Context, tx pgx.Tx, dead []capture.DeadEvent, bad []*badRow, cut bool) ([]capture.DeadEvent, []*badRow, error) {
	if b.src.sql.copyDead == "" {
		return dead, bad, nil
	}
	ids := make([]string, 0, len(dead)+len(bad))
	var f failures
	for _, d := range dead {
		ids = append(ids, b.storedID(d.Event))
		f.add(d)
	}
	for _, r := range bad {
		if r.vals[fID] != nil {
			ids = append(ids, *r.vals[fID])
			f.addBad(r)
		}
	}
	rows, _ := tx.Query(ctx, b.src.sql.copyFrom(cut), append([]any{ids}, f.args()...)...)
	copied, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("copy dead rows: %w", err)
	}
	in := make(map[string]bool, len(copied))
	for _, id := range copied {
		in[id] = true
	}
	var goneDead []capture.DeadEvent
	for _, d := range dead {
		if !in[b.storedID(d.Event)] {
			goneDead = append(goneDead, d)
		}
	}
	var goneBad []*badRow
	for _, r := range bad {
		if r.vals[fID] == nil || !in[*r.vals[fID]] {
			goneBad = append(goneBad, r)
		}
	}
	return goneDead, goneBad, nil
}

// failures are the failure columns of dead-letter rows, one element per
// row.
type failures struct {
	errs, classes []string
	attempts      []int32
	first, last   []time.Time
}

func (f *failures) add(d capture.DeadEvent) {
	f.errs, f.classes = append(f.errs, rowtext.Error(d.Err)), append(f.classes, d.Class)
	f.attempts = append(f.attempts, int32(d.Attempts))
	f.first, f.last = append(f.first, time.Unix(0, d.FirstFailed)), append(f.last, time.Unix(0, d.LastFailed))
}

// addBad adds a bad row, failed once, now.
func (f *failures) addBad(r *badRow) {
	now := time.Now().UnixNano()
	f.add(capture.DeadEvent{Err: r.err, Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now})
}

func (f *failures) args() []any { return []any{f.errs, f.classes, f.attempts, f.first, f.last} }

// txLimits is the first statement of the dead-letter transaction: no
// statement of it waits for a lock or runs longer than txLimit, and it is
// never left idle longer, so a row lock another session holds on a dead
// row (an application's UPDATE, SELECT … FOR UPDATE) fails the archive
// instead of blocking capture.
const txLimits = `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true),
	set_config('idle_in_transaction_session_timeout', $1, true)`

// txLimit is txLimits' bound in milliseconds: half of archiveTimeout,
// which bounds the whole archive on the client side.
var txLimit = strconv.FormatInt((archiveTimeout / 2).Milliseconds(), 10)

// deadArgs returns the arguments of the dead-letter insert of the dead
// events and bad rows whose row is gone from the outbox: their columns as
// text (cast back to their types in SQL), then the failure.
func (b *batch) deadArgs(dead []capture.DeadEvent, bad []*badRow) []any {
	n := len(dead) + len(bad)
	var cols [numFields][]*string
	for k := range cols {
		cols[k] = make([]*string, 0, n)
	}
	var f failures
	seqOf := b.seqIndex(dead)
	for _, d := range dead {
		for k, v := range b.values(d.Event, seqOf[d.Event]) {
			cols[k] = append(cols[k], v)
		}
		f.add(d)
	}
	for _, r := range bad {
		for k, v := range r.vals {
			cols[k] = append(cols[k], v)
		}
		f.addBad(r)
	}
	args := make([]any, 0, numFields+5)
	for _, c := range cols {
		args = append(args, c)
	}
	return append(args, f.args()...)
}

// storedID returns ev's id as its outbox row stores it.
func (b *batch) storedID(ev *event.Event) string {
	if id, ok := b.stored[ev]; ok {
		return id
	}
	return ev.ID
}

// seqIndex maps the dead events to their seq values.
func (b *batch) seqIndex(dead []capture.DeadEvent) map[*event.Event]int64 {
	if len(dead) == 0 {
		return nil
	}
	m := make(map[*event.Event]int64, len(b.events))
	for i, ev := range b.events {
		m[ev] = b.seqs[i]
	}
	return m
}

// values renders an event's columns as text, as the dead-letter insert
// expects them.
func (b *batch) values(ev *event.Event, seq int64) [numFields]*string {
	str := func(s string) *string { return &s }
	var v [numFields]*string
	v[fID], v[fAggregateType], v[fAggregateID], v[fEventType] = str(b.storedID(ev)), &ev.AggregateType, &ev.AggregateID, &ev.EventType
	if ev.ContentType == event.ContentTypeBinary || b.src.opts.MessagePrefix != "" { // the table-free outbox's payload column is bytea
		v[fPayload] = str(`\x` + hex.EncodeToString(ev.Payload))
	} else {
		v[fPayload] = str(string(ev.Payload))
	}
	if ev.Headers != nil {
		h, _ := json.Marshal(ev.Headers) // a map of strings always marshals
		v[fHeaders] = str(string(h))
	}
	if !ev.CreatedAt.IsZero() {
		v[fCreatedAt] = str(ev.CreatedAt.Format(time.RFC3339Nano))
	}
	v[fSeq] = str(strconv.FormatInt(seq, 10))
	if ev.OrderKey != "" {
		v[fOrder] = &ev.OrderKey
	}
	return v
}

// queries are the archive statements, built once with quoted identifiers.
type queries struct {
	archive, dropDead, deadLetter, copyDead string
	// deadLetterCut and copyDeadCut are deadLetter and copyDead keeping
	// long values cut (see schema.Layout.DeadLetterRow).
	deadLetterCut, copyDeadCut string
	unarchived                 string // see schema.Layout.UnarchivedByID
	leave                      string // schema.Layout.LeaveDrain
}

// insertDead returns deadLetter, or with cut deadLetterCut.
func (q queries) insertDead(cut bool) string {
	if cut {
		return q.deadLetterCut
	}
	return q.deadLetter
}

// copyFrom returns copyDead, or with cut copyDeadCut.
func (q queries) copyFrom(cut bool) string {
	if cut {
		return q.copyDeadCut
	}
	return q.copyDead
}

// buildQueries builds the archive statements for archive mode mode; values
// are cast to the outbox column types found by schema.Inspect.
func buildQueries(l schema.Layout, mode string, info schema.Info, slot string) queries {
	// The ids go as text[] and are cast in SQL: pgx encodes a []string for
	// a text[] parameter directly, while for uuid[] it first tries a plan
	// that fails, building an error per call.
	idType := "text[]::" + info.Types[l.Cols.ID]
	info.Types = l.DeadLetterTypes(info.Types)
	q := queries{
		archive:       l.ArchiveByKey(mode, l.Cols.ID, idType),
		dropDead:      l.ArchiveByKey(schema.ArchiveDelete, l.Cols.ID, idType),
		unarchived:    l.UnarchivedByID(mode, idType),
		leave:         l.LeaveDrain(slot),
		deadLetter:    deadLetterSQL(l, info, false),
		deadLetterCut: deadLetterSQL(l, info, true),
	}
	if len(info.Missing) == 0 { // else the dead rows are written from their values
		q.copyDead, q.copyDeadCut = copyDeadSQL(l, info, idType, false), copyDeadSQL(l, info, idType, true)
	}
	return q
}

// deadLetterSQL returns the statement inserting dead letters from their
// values: $1 to $numFields hold the columns as text (in the fields'
// order), the next five the failures; cut as for
// schema.Layout.DeadLetterRow.
func deadLetterSQL(l schema.Layout, info schema.Info, cut bool) string {
	in, alias := make([]string, numFields), make([]string, numFields)
	for k := range numFields {
		alias[k] = fmt.Sprintf("c%d", k)
		in[k] = fmt.Sprintf("$%d::text[]", k+1)
	}
	row := l.DeadLetterRow(func(k int, name string) string { return fmt.Sprintf("d.c%d::%s", k, info.Types[name]) }, "d.error", info.Types, cut)
	return fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.class, d.attempts, d.first_failed, d.last_failed
			FROM unnest(%s, $%d::text[], $%d::text[], $%d::int[], $%d::timestamptz[], $%d::timestamptz[])
			AS d(%s, error, class, attempts, first_failed, last_failed)`,
		l.DeadLetter.Ident(), l.Cols.Quoted(""), row, strings.Join(in, ", "),
		numFields+1, numFields+2, numFields+3, numFields+4, numFields+5, strings.Join(alias, ", "))
}

// copyDeadSQL returns the statement copying the outbox rows with ids $1
// to the dead-letter table with their failures ($2 to $6), returning the
// ids copied; cut as for schema.Layout.DeadLetterRow.
func copyDeadSQL(l schema.Layout, info schema.Info, idType string, cut bool) string {
	row := l.DeadLetterRow(func(_ int, name string) string { return "o." + schema.Q(name) }, "d.error", info.Types, cut)
	return fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.class, d.attempts, d.first_failed, d.last_failed
			FROM %s o JOIN unnest($1::%s[], $2::text[], $3::text[], $4::int[], $5::timestamptz[], $6::timestamptz[])
			AS d(id, error, class, attempts, first_failed, last_failed) ON o.%s = d.id
			RETURNING %s::text`,
		l.DeadLetter.Ident(), l.Cols.Quoted(""), row, l.Outbox.Ident(), idType, schema.Q(l.Cols.ID), schema.Q(l.Cols.ID))
}

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
}

func (b *batch) rows() int { return len(b.events) + len(b.bad) }

// Events returns the batch's events in commit order.
func (b *batch) Events() []*event.Event { return b.events }

// Complete archives the published rows (per Options.ArchiveMode), writes
// the dead ones, from the event values, to the dead-letter table and
// deletes them from the outbox, in one transaction. Rows that are already gone (inserted and deleted in one
// transaction by the application) are no-ops. The archive takes at most
// archiveTimeout, whatever locks other sessions hold. Then the batch counts as
// archived for the slot's confirmed position. When archiving fails, the
// stream restarts from the confirmed position, so the batch's events are
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
	if err := b.recordLeft(ctx, o); err != nil {
		return err
	}
	published := make([]string, len(o.Published))
	for i, ev := range o.Published {
		published[i] = b.storedID(ev)
	}
	dead := make([]string, 0, len(o.Dead)+len(b.bad))
	for _, d := range o.Dead {
		dead = append(dead, b.storedID(d.Event))
	}
	for _, r := range b.bad {
		if r.vals[fID] != nil {
			dead = append(dead, *r.vals[fID])
		}
	}
	if len(o.Dead)+len(b.bad) == 0 {
		if len(published) == 0 {
			return nil
		}
		return b.src.arch.archive(ctx, published, b.xids)
	}
	q, pool := b.src.sql, b.src.opts.Pool
	ctx, cancel := context.WithTimeout(ctx, archiveTimeout)
	defer cancel()
	if err := waitVisible(ctx, pool, b.xids); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, txLimits, txLimit); err != nil {
			return err
		}
		goneDead, goneBad, err := b.copyDead(ctx, tx, o.Dead)
		if err != nil {
			return err
		}
		br := &pgx.Batch{}
		if len(goneDead)+len(goneBad) > 0 {
			br.Queue(q.deadLetter, b.deadArgs(goneDead, goneBad)...)
		}
		br.Queue(q.dropDead, dead)
		if len(published) > 0 {
			br.Queue(q.archive, published)
		}
		return tx.SendBatch(ctx, br).Close()
	})
	if err != nil {
		return fmt.Errorf("archive %d rows and dead-letter %d: %w", len(published), len(o.Dead)+len(b.bad), err)
	}
	return nil
}

// recordLeft records, when o leaves events of b in the outbox (held for a
// broken destination, see capture.Holder), that the slot's pending drain
// covers them, before the slot may be confirmed past them: they are
// published from the table when their destination works again, or after
// a restart.
func (b *batch) recordLeft(ctx context.Context, o capture.Outcome) error {
	left := o.Left(b.events)
	if len(left) == 0 {
		return nil
	}
	var top int64
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
// outbox to the dead-letter table, from the table rather than from the
// values received, so that a large payload is not sent back to the server
// it came from. It returns the dead events and bad rows whose row is gone
// (the application inserted and deleted it in one transaction).
func (b *batch) copyDead(ctx context.Context, tx pgx.Tx, dead []capture.DeadEvent) ([]capture.DeadEvent, []*badRow, error) {
	ids := make([]string, 0, len(dead)+len(b.bad))
	var f failures
	for _, d := range dead {
		ids = append(ids, b.storedID(d.Event))
		f.add(d)
	}
	for _, r := range b.bad {
		if r.vals[fID] != nil {
			ids = append(ids, *r.vals[fID])
			f.addBad(r)
		}
	}
	rows, _ := tx.Query(ctx, b.src.sql.copyDead, append([]any{ids}, f.args()...)...)
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
	for _, r := range b.bad {
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
	if ev.ContentType == event.ContentTypeBinary {
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
	unarchived                              string // see schema.Layout.UnarchivedByID
	leave                                   string // schema.Layout.LeaveDrain
}

// buildQueries builds the archive statements for archive mode mode; values
// are cast to the outbox column types found by schema.Inspect.
func buildQueries(l schema.Layout, mode string, info schema.Info, slot string) queries {
	// The ids go as text[] and are cast in SQL: pgx encodes a []string for
	// a text[] parameter directly, while for uuid[] it first tries a plan
	// that fails, building an error per call.
	idType := "text[]::" + info.Types[l.Cols.ID]
	var sel []string
	in, alias := make([]string, numFields), make([]string, numFields)
	for k := range numFields {
		alias[k] = fmt.Sprintf("c%d", k)
		in[k] = fmt.Sprintf("$%d::text[]", k+1)
	}
	for k, c := range l.Cols.List() {
		sel = append(sel, fmt.Sprintf("d.c%d::%s", k, info.Types[c]))
	}
	return queries{
		archive:    l.ArchiveByKey(mode, l.Cols.ID, idType),
		dropDead:   l.ArchiveByKey(schema.ArchiveDelete, l.Cols.ID, idType),
		unarchived: l.UnarchivedByID(mode, idType),
		leave:      l.LeaveDrain(slot),
		deadLetter: fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.error, d.class, d.attempts, d.first_failed, d.last_failed
			FROM unnest(%s, $%d::text[], $%d::text[], $%d::int[], $%d::timestamptz[], $%d::timestamptz[])
			AS d(%s, error, class, attempts, first_failed, last_failed)`,
			l.DeadLetter.Ident(), l.Cols.Quoted(""), strings.Join(sel, ", "), strings.Join(in, ", "),
			numFields+1, numFields+2, numFields+3, numFields+4, numFields+5, strings.Join(alias, ", ")),
		copyDead: fmt.Sprintf(`INSERT INTO %s (%s, error, error_class, attempts, first_failed_at, last_failed_at)
			SELECT %s, d.error, d.class, d.attempts, d.first_failed, d.last_failed
			FROM %s o JOIN unnest($1::%s[], $2::text[], $3::text[], $4::int[], $5::timestamptz[], $6::timestamptz[])
			AS d(id, error, class, attempts, first_failed, last_failed) ON o.%s = d.id
			RETURNING %s::text`,
			l.DeadLetter.Ident(), l.Cols.Quoted(""), l.Cols.Quoted("o"), l.Outbox.Ident(), idType, schema.Q(l.Cols.ID), schema.Q(l.Cols.ID)),
	}
}

package wal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
)

// messageOptions returns source options capturing the table-free outbox of
// a database without an outbox table.
func messageOptions(t testing.TB, batch int) (*pgxpool.Pool, wal.Options) {
	pool := setup(t, layout)
	mustExec(t, pool, `DROP TABLE outbox`)
	o := options(t, pool, layout, batch)
	o.MessagePrefix = "outbox"
	return pool, o
}

// emitSQL is the statement of docs/reference.md that writes one outbox
// message: $1 the aggregate id, $2 the JSON payload.
const emitSQL = `SELECT pg_logical_emit_message(true, 'outbox', json_build_object(
	'id', $1::uuid, 'aggregate_type', 'order', 'aggregate_id', $2::text, 'event_type', 'step',
	'payload', $3::jsonb, 'headers', json_build_object('trace', 't'))::text)`

// emit writes one outbox message in tx and returns its id.
func emit(t testing.TB, tx pgx.Tx, agg string, step int) string {
	t.Helper()
	id := uuid.NewString()
	if _, err := tx.Exec(context.Background(), emitSQL, id, agg, fmt.Sprintf(`{"aggregate":%q,"step":%d}`, agg, step)); err != nil {
		t.Fatal(err)
	}
	return id
}

// inTx runs f in a transaction on pool and commits it.
func inTx(t testing.TB, pool *pgxpool.Pool, f func(tx pgx.Tx)) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		f(tx)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMessagesCapture: the source captures the outbox messages of committed
// transactions in commit order with their ids, headers and payloads, skips
// rolled-back ones and other prefixes, and the slot is confirmed past them
// once their batches complete.
func TestMessagesCapture(t *testing.T) {
	t.Parallel()
	pool, o := messageOptions(t, 100)
	src := newStreaming(t, o)
	var want []string
	inTx(t, pool, func(tx pgx.Tx) {
		want = append(want, emit(t, tx, "a", 1), emit(t, tx, "b", 1))
		mustExec(t, tx, `SELECT pg_logical_emit_message(true, 'other', 'not ours')`)
	})
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	emit(t, tx, "a", 99)
	tx.Rollback(context.Background())
	inTx(t, pool, func(tx pgx.Tx) { want = append(want, emit(t, tx, "a", 2)) })
	got := events(collect(t, src, len(want), 20*time.Second))
	if !slices.Equal(ids(got), want) {
		t.Fatalf("ids %v, want %v", ids(got), want)
	}
	ev := got[2]
	if ev.AggregateType != "order" || ev.AggregateID != "a" || ev.EventType != "step" || ev.ContentType != event.ContentTypeJSON ||
		ev.Headers["trace"] != "t" || ev.CreatedAt.IsZero() {
		t.Fatalf("event %+v", ev)
	}
	var body struct{ Step int }
	if err := json.Unmarshal(ev.Payload, &body); err != nil || body.Step != 2 {
		t.Fatalf("payload %s: %v", ev.Payload, err)
	}
	if got[0].Position >= got[2].Position {
		t.Fatalf("positions %d, %d: want commit order", got[0].Position, got[2].Position)
	}
}

// TestMessagesMalformedDeadLettered: a message that is not a valid event
// (hostile bytes, wrong fields, not transactional) goes to the dead-letter
// table with its raw content and the reason, while the valid messages
// around it are captured in order; dead events keep their payload bytes
// (a JSON one with a backslash, which a text to bytea cast would refuse);
// the slot moves past all of them.
func TestMessagesMalformedDeadLettered(t *testing.T) {
	t.Parallel()
	pool, o := messageOptions(t, 100)
	src := newStreaming(t, o)
	bad := map[string]string{
		`not json`:  "not a JSON object",
		`{"id": 5}`: "not a JSON object",
		`{"aggregate_type":"o","aggregate_id":"a","event_type":"e","payload":{}}`:                                             "id is missing",
		`{"id":"x","aggregate_type":"o","aggregate_id":"a","event_type":"e","payload":{}}`:                                    "is not a UUID",
		`{"id":"` + uuid.NewString() + `","aggregate_type":"o","aggregate_id":"a\u0000","event_type":"e","payload":{}}`:       "NUL",
		`{"id":"` + uuid.NewString() + `","aggregate_type":"o","aggregate_id":"a","event_type":"e"}`:                          "payload is missing",
		`{"id":"` + uuid.NewString() + `","aggregate_type":"o","aggregate_id":"a","event_type":"e","payload":1,"headers":[]}`: "headers must be",
	}
	var want []string
	inTx(t, pool, func(tx pgx.Tx) {
		want = append(want, emit(t, tx, "a", 1))
		for content := range bad {
			mustExec(t, tx, `SELECT pg_logical_emit_message(true, 'outbox', $1::text)`, content)
		}
		mustExec(t, tx, `SELECT pg_logical_emit_message(true, 'outbox', '\xff00fe'::bytea)`)
		want = append(want, emit(t, tx, "a", 2))
	})
	mustExec(t, pool, `SELECT pg_logical_emit_message(false, 'outbox', $1::text)`, `{"id":"`+uuid.NewString()+`"}`)
	inTx(t, pool, func(tx pgx.Tx) {
		want = append(want, emit(t, tx, "a", 3))
		mustExec(t, tx, `SELECT pg_logical_emit_message(true, 'outbox', $1::text)`,
			`{"id":"`+uuid.NewString()+`","aggregate_type":"o","aggregate_id":"b","event_type":"e","payload_base64":"AP8="}`)
		mustExec(t, tx, `SELECT pg_logical_emit_message(true, 'outbox', $1::text)`,
			`{"id":"`+uuid.NewString()+`","aggregate_type":"o","aggregate_id":"b","event_type":"e","payload":{"p":"back\\slash"}}`)
	})
	var got []*event.Event
	for len(got) < len(want)+2 {
		b := next(t, src, 20*time.Second)
		if b == nil {
			t.Fatalf("got %d events, want %d", len(got), len(want)+2)
		}
		var dead []capture.DeadEvent
		var published []*event.Event
		got = append(got, b.Events()...)
		for _, ev := range b.Events() {
			if ev.AggregateID == "b" {
				dead = append(dead, capture.DeadEvent{Event: ev, Err: "refused", Class: "permanent", Attempts: 1})
			} else {
				published = append(published, ev)
			}
		}
		if err := b.Complete(context.Background(), capture.Outcome{Published: published, Dead: dead}); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(ids(got[:3]), want) {
		t.Fatalf("ids %v, want %v", ids(got), want)
	}
	rows, err := pool.Query(context.Background(), `SELECT coalesce(id, ''), payload, error FROM outbox_dead_letter`)
	if err != nil {
		t.Fatal(err)
	}
	type deadRow struct {
		id      string
		payload []byte
		err     string
	}
	dls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadRow, error) {
		var d deadRow
		return d, r.Scan(&d.id, &d.payload, &d.err)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != len(bad)+4 {
		t.Fatalf("%d dead letters, want %d: %+v", len(dls), len(bad)+4, dls)
	}
	found := map[string]bool{}
	for _, d := range dls {
		found[string(d.payload)] = true
		if want, ok := bad[string(d.payload)]; ok && !strings.Contains(d.err, want) {
			t.Errorf("dead letter %q: error %q, want it to say %q", d.payload, d.err, want)
		}
	}
	for content := range bad {
		if !found[content] {
			t.Errorf("malformed message %q not dead-lettered with its raw content", content)
		}
	}
	if !found["\xff\x00\xfe"] || !found["\x00\xff"] || !found[`{"p":"back\\slash"}`] {
		t.Errorf("dead letters %+v: want the binary message's raw bytes and the dead events' payloads", dls)
	}
	end := currentLSN(t, pool)
	waitFor(t, 10*time.Second, "the slot to move past the messages", func() bool { return confirmed(t, pool, o.Slot) >= end })
}

// TestMessagesOldDeadLetterRefused: a dead-letter table made for an outbox
// table (uuid id, jsonb payload) cannot keep a malformed message's raw
// content, so the source refuses to start, naming it.
func TestMessagesOldDeadLetterRefused(t *testing.T) {
	t.Parallel()
	pool := setup(t, layout)
	mustExec(t, pool, schema.Layout(layout).CreateDeadLetter(nil)[0])
	o := options(t, pool, layout, 10)
	o.MessagePrefix = "outbox"
	if _, err := wal.New(context.Background(), o); err == nil || !strings.Contains(err.Error(), "needs text and bytea") {
		t.Fatalf("err = %v, want the dead-letter table's types refused", err)
	}
}

// currentLSN returns the server's current WAL position.
func currentLSN(t testing.TB, q *pgxpool.Pool) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := q.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// TestMessagesSlotDropped: the table-free outbox has no table to publish
// from, so a message committed while the slot is missing is lost; the
// source recreates the slot, counts it as dropped, and captures the
// messages committed after it.
func TestMessagesSlotDropped(t *testing.T) {
	t.Parallel()
	pool, o := messageOptions(t, 10)
	src := newStreaming(t, o)
	var first string
	inTx(t, pool, func(tx pgx.Tx) { first = emit(t, tx, "a", 1) })
	b := next(t, src, 20*time.Second)
	if b == nil || len(b.Events()) != 1 || b.Events()[0].ID != first {
		t.Fatalf("batch %v, want [%s]", b, first)
	}
	complete(t, b)
	waitFor(t, 10*time.Second, "the slot to be dropped", func() bool {
		_, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid), pg_drop_replication_slot(slot_name)
			FROM pg_replication_slots WHERE slot_name = $1`, o.Slot)
		return err == nil
	})
	inTx(t, pool, func(tx pgx.Tx) { emit(t, tx, "a", 2) }) // no slot: lost
	waitFor(t, 20*time.Second, "the slot to be recreated", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if b, _ := src.Next(ctx); b != nil { // the stream's end, then the new slot's stream
			t.Fatalf("batch %v while the slot was missing", ids(b.Events()))
		}
		return src.SlotRecreated(wal.RecreatedDropped) == 1 && wal.Streaming(src)
	})
	var third string
	inTx(t, pool, func(tx pgx.Tx) { third = emit(t, tx, "a", 3) })
	got := events(collect(t, src, 1, 20*time.Second))
	if len(got) != 1 || got[0].ID != third {
		t.Fatalf("ids %v after the slot was recreated, want [%s]: the message committed while it was missing is lost", ids(got), third)
	}
}

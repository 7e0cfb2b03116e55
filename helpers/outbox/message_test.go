package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/helpers/outbox"
)

// TestEmit: Emit writes the event as a transactional logical decoding
// message with the relay's JSON content, a JSON payload as it is and a
// []byte payload in base64; a rolled-back transaction emits nothing, and
// an invalid event writes nothing.
func TestEmit(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t, `SELECT pg_create_logical_replication_slot('emit_test', 'test_decoding')`)
	ctx := context.Background()
	var ids []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err := outbox.Emit(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "created",
			Payload: map[string]any{"total": "<1>"}, Headers: map[string]string{"k": "v"}})
		ids = append(ids, id)
		if err != nil {
			return err
		}
		id, err = outbox.EmitPrefix(ctx, tx, "other", outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "paid",
			Payload: []byte{0, 0xff}})
		ids = append(ids, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Emit(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "43", EventType: "created", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)
	_, err = outbox.Emit(ctx, pool, outbox.Event{AggregateType: "order", AggregateID: "a\x00", EventType: "created", Payload: 1})
	if !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("NUL in the aggregate id: err = %v, want ErrInvalidEvent", err)
	}

	rows, err := pool.Query(ctx, `SELECT data FROM pg_logical_slot_get_changes('emit_test', NULL, NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	data, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var msgs []map[string]any
	var prefixes []string
	for _, d := range data {
		head, content, ok := strings.Cut(d, " content:")
		if !ok {
			continue
		}
		if !strings.HasPrefix(head, "message: transactional: 1 prefix: ") {
			t.Fatalf("not a transactional message: %s", d)
		}
		prefixes = append(prefixes, strings.Split(strings.TrimPrefix(head, "message: transactional: 1 prefix: "), ",")[0])
		var m map[string]any
		if err := json.Unmarshal([]byte(content), &m); err != nil {
			t.Fatalf("content %s: %v", content, err)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 || prefixes[0] != "outbox" || prefixes[1] != "other" {
		t.Fatalf("messages %v with prefixes %v, want the two committed ones", msgs, prefixes)
	}
	first, second := msgs[0], msgs[1]
	if first["id"] != ids[0] || first["aggregate_type"] != "order" || first["aggregate_id"] != "42" || first["event_type"] != "created" ||
		first["payload"].(map[string]any)["total"] != "<1>" || first["headers"].(map[string]any)["k"] != "v" {
		t.Fatalf("first message %v", first)
	}
	if second["id"] != ids[1] || second["payload_base64"] != "AP8=" || second["payload"] != nil {
		t.Fatalf("second message %v", second)
	}
}

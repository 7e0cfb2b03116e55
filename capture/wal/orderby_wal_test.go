package wal_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/capture"
)

// TestOrderByDeadLetters streams an outbox ordered by tenant_id: the event
// carries its tenant as OrderKey, and a dead event and a bad row keep their
// tenant_id in the dead-letter table.
func TestOrderByDeadLetters(t *testing.T) {
	l := layout
	l.Cols.OrderBy = "tenant_id"
	pool := setup(t, l)
	src := newStreaming(t, options(t, pool, l, 10))
	ctx := context.Background()
	bad, good := uuid.NewString(), uuid.NewString()
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, tenant_id)
		VALUES ($1, 't', 'a', 'e', '{}', '{"n": 1}', 'bad-tenant'), ($2, 't', 'b', 'e', '{}', NULL, 'acme')`, bad, good)
	bs := collect(t, src, 1, 10*time.Second)
	evs := events(bs)
	if len(evs) != 1 || evs[0].ID != good || evs[0].OrderKey != "acme" || evs[0].Key() != "acme" {
		t.Fatalf("events %+v, want %s with order key acme", evs, good)
	}
	now := time.Now().UnixNano()
	for _, b := range bs {
		var o capture.Outcome
		for _, ev := range b.Events() {
			o.Dead = append(o.Dead, capture.DeadEvent{Event: ev, Err: "boom", Class: "permanent", Attempts: 1, FirstFailed: now, LastFailed: now})
		}
		if err := b.Complete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `SELECT id::text || ' ' || tenant_id FROM outbox_dead_letter ORDER BY aggregate_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if want := []string{bad + " bad-tenant", good + " acme"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters %v, want %v", got, want)
	}
}

package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// TestOneRowNeverStopsTheRelay puts two hostile rows among ordinary
// events: one whose aggregate_type makes a subject longer than a NATS
// server takes (which closed the connection for good), and one with
// JetStream control headers and case variants of the relay's own. The first
// is dead-lettered with a reason naming the subject rule; the second is
// published without those headers, which relay_row_headers_dropped_total
// counts; every other event is delivered in order.
func TestOneRowNeverStopsTheRelay(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	ctx := context.Background()
	var mu sync.Mutex
	var seen nats.Header
	hostile := uuid.NewString()
	nc, err := nats.Connect(s.nats.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("outbox.order", func(m *nats.Msg) {
		if m.Header.Get("message_id") == hostile {
			mu.Lock()
			seen = m.Header
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}

	s.produce(ctx, 20, 4, 2)
	long := uuid.NewString()
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, repeat('a', 4050), 'order-0', 'step', '{}', '{"trace": "t"}')`, long); err != nil {
		t.Fatal(err)
	}
	step := s.nextStep(1)
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, 'order', 'order-1', 'step', $2, $3)`, hostile, fmt.Sprintf(`{"aggregate":"order-1","step":%d}`, step),
		`{"trace": "t", "Nats-Rollup": "all", "Nats-TTL": "1s", "Nats-Expected-Stream": "OTHER", "nats-msg-id": "evil7", "MESSAGE_ID": "evil8"}`); err != nil {
		t.Fatal(err)
	}
	s.wire.Written(hostile, "order-1", step)
	s.stream.Written(hostile, "order-1", step)
	s.produce(ctx, 20, 4, 2)

	relay := s.start()
	s.waitDrained(60 * time.Second)
	for reason, want := range map[string]float64{"control": 3, "reserved": 2} {
		name := fmt.Sprintf(`relay_row_headers_dropped_total{reason=%q,sink="nats"}`, reason)
		if got := scrapeCounter(addr, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	relay.stop(t, 15*time.Second)
	s.verify()
	mu.Lock()
	for k, v := range seen {
		if strings.HasPrefix(strings.ToLower(k), "nats-") && k != "Nats-Msg-Id" || strings.EqualFold(k, "message_id") && k != "message_id" {
			t.Errorf("the row header %s: %v was published", k, v)
		}
	}
	if seen == nil {
		t.Error("the event with hostile headers was not seen on the wire")
	}
	mu.Unlock()
	var id, msg, class string
	if err := s.pool.QueryRow(ctx, `SELECT id::text, error, error_class FROM outbox_dead_letter`).Scan(&id, &msg, &class); err != nil {
		t.Fatal(err)
	}
	if id != long || class != "permanent" || !strings.Contains(msg, "over the 1024") || len(msg) > 1024 {
		t.Fatalf("dead letter %s %.300q %s", id, msg, class)
	}
}

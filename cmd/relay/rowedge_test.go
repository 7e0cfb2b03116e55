package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/sink/template"
)

// TestOneRowNeverStopsTheRelay puts two hostile rows among ordinary
// events: one whose aggregate_type would make a subject longer than a NATS
// server takes (which closed the connection for good), and one with
// JetStream control headers and case variants of the relay's own. The first
// is published on the subject cut to 1,024 bytes and ended by the value's
// hash; the second is published without those headers, which
// relay_row_headers_dropped_total counts; every event is delivered in
// order and nothing is dead-lettered.
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

	var longSubject atomic.Value
	long := uuid.NewString()
	if _, err := nc.Subscribe("outbox.*", func(m *nats.Msg) {
		if m.Header.Get("message_id") == long {
			longSubject.Store(m.Subject)
		}
	}); err != nil {
		t.Fatal(err)
	}

	s.produce(ctx, 20, 4, 2)
	longStep := s.nextStep(0)
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, repeat('a', 4050), 'order-0', 'step', $2, '{"trace": "t"}')`, long,
		fmt.Sprintf(`{"aggregate":"order-0","step":%d}`, longStep)); err != nil {
		t.Fatal(err)
	}
	s.wire.Written(long, "order-0", longStep)
	s.stream.Written(long, "order-0", longStep)
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
	s.readStream()
	for name, r := range map[string]verify.Report{"on the wire": s.wire.Check(), "in the stream": s.stream.Check()} {
		// The long row's aggregate_type is its only problem.
		if len(r.Problems) != 1 || !strings.HasPrefix(r.Problems[0], long+": ") {
			t.Errorf("%s: problems %.300q, want the long row's aggregate_type only", name, r.Problems)
		}
		r.Problems = nil
		if err := r.Err(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
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
	if n := s.deadLetters(); n != 0 {
		t.Errorf("%d events dead-lettered, want none", n)
	}
	want := "outbox." + strings.Repeat("a", destname.MaxNATSSubject-len("outbox.")-template.HashLen) + template.Hash(strings.Repeat("a", 4050))
	if got, _ := longSubject.Load().(string); got != want {
		t.Errorf("the long row went to %.40q… (%d bytes), want %.40q… ending in %s", got, len(got), want, template.Hash(strings.Repeat("a", 4050)))
	}
}

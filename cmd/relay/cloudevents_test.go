package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

// TestCloudEventsEnvelope runs relay run with sink.envelope: cloudevents
// into a webhook receiver, in both capture modes, and reads every request
// with the CloudEvents SDK's HTTP binding: each is a valid CloudEvent whose
// attributes come from its outbox row (source prefix joined with the
// aggregate_type, the traceparent extension from the row's headers).
func TestCloudEventsEnvelope(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			var mu sync.Mutex
			got := map[string]http.Header{}
			bodies := map[string][]byte{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				defer mu.Unlock()
				got[r.Header.Get("Idempotency-Key")], bodies[r.Header.Get("Idempotency-Key")] = r.Header.Clone(), body
			}))
			t.Cleanup(srv.Close)
			sinkYAML := fmt.Sprintf("sink:\n  type: webhook\n  envelope: cloudevents\n  cloudevents:\n    source: %s\n  webhook:\n    url: %s/{aggregate_type}\n",
				envelopetest.Source, srv.URL)
			s := newStack(t, stackOptions{Mode: mode, Sink: sinkYAML, Collect: func() []verify.Delivery { return nil }})

			at := time.Date(2026, 12, 1, 8, 0, 0, 123456000, time.UTC)
			rows := []*event.Event{
				{ID: uuid.NewString(), AggregateType: "order", AggregateID: "o-1", EventType: "order.created",
					Payload: []byte(`{"total": 12.5, "items": ["a"]}`), CreatedAt: at,
					Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
				{ID: uuid.NewString(), AggregateType: "order", AggregateID: "Zoë 2", EventType: "order.noted",
					Payload: []byte(`"a note"`), CreatedAt: at.Add(time.Second)},
			}
			relay := s.start()
			for _, e := range rows {
				e.ContentType = event.ContentTypeJSON
				headers := `{}`
				if tp := e.Headers["traceparent"]; tp != "" {
					headers = `{"traceparent": "` + tp + `"}`
				}
				if _, err := s.pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
					VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.ID, e.AggregateType, e.AggregateID, e.EventType, string(e.Payload), headers, e.CreatedAt); err != nil {
					t.Fatal(err)
				}
			}
			received := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
			for deadline := time.Now().Add(60 * time.Second); received() < len(rows); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("received %d of %d events within 60s", received(), len(rows))
				}
			}
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("relay exited %d after SIGTERM, want 0", code)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, e := range rows {
				h := got[e.ID]
				if h == nil {
					t.Fatalf("event %s not received", e.ID)
				}
				ev, err := envelopetest.FromHTTP(h, bodies[e.ID])
				if err != nil {
					t.Fatalf("%s: the SDK rejects the request: %v (headers %v)", e.ID, err, h)
				}
				if err := envelopetest.Match(ev, e, envelopetest.Source+"/order"); err != nil {
					t.Errorf("%s: %v", e.ID, err)
				}
			}
		})
	}
}

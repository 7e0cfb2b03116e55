package webhook

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

// TestCloudEvents posts to an httptest receiver with the cloudevents
// envelope and reads each request with the CloudEvents SDK's HTTP binding:
// every attribute is right, Ce- headers from the row or
// sink.webhook.headers are replaced, the contract headers and the
// signature stay, and an event without event_type fails as permanent.
// Without the envelope no Ce- header is sent.
func TestCloudEvents(t *testing.T) {
	rc := newReceiver(t, nil)
	cfg := Config{URL: rc.URL + "/{aggregate_type}", Secret: testSecret, Headers: map[string]string{"Ce-Source": "static", "X-Static": "1"}}
	s, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler), Envelope: envelopetest.New()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	events := envelopetest.Events()
	if err := s.Publish(context.Background(), events); err != nil {
		t.Fatal(err)
	}
	bad := testEvent(9, "o-9")
	bad.EventType = ""
	if err := s.Publish(context.Background(), []*event.Event{bad}); fault.ClassOf(sink.Failed(err, 0)) != fault.Permanent {
		t.Errorf("event without event_type: %v, want a permanent error", err)
	}
	reqs := rc.requests()
	if len(reqs) != len(events) {
		t.Fatalf("receiver got %d requests, want %d", len(reqs), len(events))
	}
	for _, r := range reqs {
		e := envelopetest.Of(events, r.Header.Get(HeaderIdempotencyKey))
		if e == nil {
			t.Fatalf("request with Idempotency-Key %q was not sent", r.Header.Get(HeaderIdempotencyKey))
		}
		got, err := envelopetest.FromHTTP(r.Header, r.Body)
		if err != nil {
			t.Fatalf("%s: the SDK rejects the request: %v (headers %v)", e.ID, err, r.Header)
		}
		if err := envelopetest.Match(got, e, envelopetest.Source+"/order"); err != nil {
			t.Errorf("%s: %v", e.ID, err)
		}
		h := r.Header
		if h.Get(HeaderMessageID) != e.ID || h.Get("X-Static") != "1" || h.Get(HeaderSignature) == "" || h.Get("Content-Type") != e.ContentType {
			t.Errorf("%s: contract, static or signature headers changed: %v", e.ID, h)
		}
		if e.Headers["trace_id"] != "" && h.Get("Trace_id") != "t-1" {
			t.Errorf("%s: row header trace_id not forwarded: %v", e.ID, h)
		}
	}

	plain := newSink(t, Config{URL: rc.URL})
	if err := plain.Publish(context.Background(), []*event.Event{testEvent(10, "o-10")}); err != nil {
		t.Fatal(err)
	}
	last := rc.requests()[len(events)]
	for k := range last.Header {
		if strings.HasPrefix(strings.ToLower(k), "ce-") {
			t.Errorf("without the envelope: header %s sent", k)
		}
	}
}

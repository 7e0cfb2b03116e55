package webhook

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// TestRowControlAndReservedHeaders: row headers named like a header the
// relay sets on any sink (in any case), hop-by-hop and framing headers are
// dropped and counted; the others arrive.
func TestRowControlAndReservedHeaders(t *testing.T) {
	rc := newReceiver(t, nil)
	drops := sink.NewHeaderDrops(nil)
	s, err := New(Config{URL: rc.URL + "/in"}, Options{Logger: slog.New(slog.DiscardHandler), HeaderDrops: drops})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e := testEvent(1, "a1")
	e.Headers = map[string]string{"Nats-Msg-Id": "evil", "user-agent": "evil", "MESSAGE_ID": "evil", "webhook-id": "evil",
		"Transfer-Encoding": "chunked", "connection": "close", "Proxy-Authorization": "Basic ZXZpbA==", "Keep-Alive": "timeout=1",
		"TE": "trailers", "Upgrade": "h2c", "x-ok": "1"}
	if err := s.Publish(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	reqs := rc.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	h := reqs[0].Header
	for k, v := range h {
		if slices.Contains(v, "evil") || k == "Nats-Msg-Id" || k == "Proxy-Authorization" || k == "Upgrade" || k == "Te" {
			t.Errorf("the row header %s: %v was sent", k, v)
		}
	}
	if h.Get("X-Ok") != "1" || !strings.HasPrefix(h.Get("User-Agent"), "outbox-relay") {
		t.Errorf("headers %v: want X-Ok and the relay's User-Agent", h)
	}
	if r, c := drops.Count(sink.DropReserved), drops.Count(sink.DropControl); r != 4 || c != 6 {
		t.Errorf("dropped %d reserved and %d control headers, want 4 and 6", r, c)
	}
}

// TestLongURLDeadLettered: a rendered URL longer than servers take fails
// alone as permanent; its neighbour is delivered.
func TestLongURLDeadLettered(t *testing.T) {
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.URL + "/in/{aggregate_id}"})
	batch := testEvents(2)
	batch[0].AggregateID = strings.Repeat("a", 9000)
	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 2), []string{"permanent", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	if msg := sink.Failed(err, 0).Error(); !strings.Contains(msg, "8000") || len(msg) > 600 {
		t.Errorf("the error does not name the URL rule in a short message: %.300s", msg)
	}
	if n := len(rc.requests()); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}
}

// FuzzRowHeaders builds the request headers of events with arbitrary row
// headers: the relay's own headers are sent once with their values, none
// named like the relay's or framing the request comes from the row, a name
// HTTP cannot carry is an error, and no value holds CR or LF.
func FuzzRowHeaders(f *testing.F) {
	f.Add("X-Tenant", "t1", "Transfer-Encoding", "chunked")
	f.Add("nats-msg-id", "evil", "user-agent", "evil")
	f.Add("Proxy-Authorization", "x", "CONNECTION", "close")
	f.Add("bad name", "v", "x", "a\r\nInjected: 1")
	f.Add("\xff", "\x00", "Webhook-Signature", "v1,x")
	s, err := New(Config{URL: "http://127.0.0.1:1/in"}, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		e := testEvent(1, "a1")
		e.Headers = map[string]string{k1: v1, k2: v2}
		h, err := s.header(e)
		if err != nil {
			if !strings.Contains(err.Error(), "not a valid HTTP header name") {
				t.Fatalf("row headers %q: %v", e.Headers, err)
			}
			return
		}
		own := map[string]string{HeaderIdempotencyKey: e.ID, HeaderMessageID: e.ID, HeaderEventType: e.EventType,
			HeaderAggregateType: e.AggregateType, HeaderAggregateID: e.AggregateID, "Content-Type": e.ContentType, "User-Agent": userAgent}
		if err := sinktest.CheckSent(h, own, sink.HTTPRules); err != nil {
			t.Fatalf("row headers %q: %v", e.Headers, err)
		}
		for k, vs := range h {
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n") {
					t.Fatalf("header %s: %q", k, v)
				}
			}
		}
	})
}

// TestRowHeadersBounded: a row with more than MaxRowHeaders headers or
// more than MaxRowHeaderBytes of them (20,013 headers, one header of 1 MB)
// fails alone as permanent without a request; a row at the bounds is
// delivered, as is its neighbour.
func TestRowHeadersBounded(t *testing.T) {
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.URL + "/in/{aggregate_id}"})
	many := map[string]string{}
	for i := range 20013 {
		many[fmt.Sprintf("X-H%d", i)] = "v"
	}
	atBound := map[string]string{}
	for i := range MaxRowHeaders {
		atBound[fmt.Sprintf("X-H%d", i)] = strings.Repeat("v", 200)
	}
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"20,013 headers", many, "permanent"},
		{"a 1 MB header", map[string]string{"X-Big": strings.Repeat("b", 1<<20)}, "permanent"},
		{"at the bounds", atBound, "ok"},
	} {
		batch := testEvents(2)
		batch[0].Headers = c.headers
		before := len(rc.requests())
		err := s.Publish(context.Background(), batch)
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{c.want, "ok"}) {
			t.Errorf("%s: classes %v, want [%s ok] (err %.300v)", c.name, got, c.want, err)
		}
		if want := map[string]int{"permanent": 1, "ok": 2}[c.want]; len(rc.requests())-before != want {
			t.Errorf("%s: %d requests, want %d", c.name, len(rc.requests())-before, want)
		}
	}
}

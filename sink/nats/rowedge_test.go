package nats

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// publishAlone publishes batch and returns each event's class, failing the
// test when the connection did not survive it.
func publishAlone(t *testing.T, s *Sink, batch []*event.Event) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.Publish(ctx, batch)
	if !s.nc.IsConnected() {
		t.Fatalf("the connection is %v after the publish: %v", s.nc.Status(), err)
	}
	return sinktest.Classes(err, len(batch)), err
}

// TestLongSubjectCut: a row whose aggregate_type would render a subject
// over destname.MaxNATSSubject is published to the subject cut to that
// length and ended by the value's hash, which no other aggregate type
// shares, and its neighbours are stored beside it.
func TestLongSubjectCut(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	batch := testEvents(3, 3)
	long := strings.Repeat("a", 4050)
	batch[1].AggregateType = long

	got, err := publishAlone(t, s, batch)
	if want := []string{"ok", "ok", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	want := "outbox." + strings.Repeat("a", destname.MaxNATSSubject-len("outbox.")-template.HashLen) + template.Hash(long)
	msgs := storedMsgs(t, s)
	if len(msgs) != 3 || msgs[1].Subject() != want {
		t.Fatalf("the stream holds %d messages, the second on %.40q… (%d bytes), want %d bytes", len(msgs), msgs[1].Subject(), len(msgs[1].Subject()), len(want))
	}
}

// TestLargeHeadersDeadLettered: row headers over JetStream's 64 KiB header
// limit fail as permanent at once, not as a failure the relay would hold
// the subject for.
func TestLargeHeadersDeadLettered(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	batch := testEvents(3, 3)
	batch[0].Headers = map[string]string{}
	for i := range 70 {
		batch[0].Headers[fmt.Sprint("h", i)] = strings.Repeat("v", 1000)
	}
	got, err := publishAlone(t, s, batch)
	if want := []string{"permanent", "ok", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	if fault.IsSuspect(sink.Failed(err, 0)) {
		t.Errorf("the failure is suspect, want the event's own fault: %v", sink.Failed(err, 0))
	}
}

// TestControlHeadersDropped: JetStream headers from a row (a rollup that
// would purge the subject, a TTL, expectations) are dropped and counted;
// the event is published without them and earlier events stay.
func TestControlHeadersDropped(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	drops := sink.NewHeaderDrops(slog.New(slog.DiscardHandler))
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}", Options{HeaderDrops: drops})
	_, err := s.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OUTBOX", Subjects: []string{"outbox.>"},
		AllowRollup: true, AllowMsgTTL: true})
	if err != nil {
		t.Fatal(err)
	}
	before := testEvents(3, 1)
	if got, err := publishAlone(t, s, before); !slices.Equal(got, []string{"ok", "ok", "ok"}) {
		t.Fatalf("classes %v (err %v)", got, err)
	}
	hostile := testEvent(10, "order", "0")
	hostile.Headers = map[string]string{
		"Nats-Rollup": "sub", "Nats-TTL": "1s", "Nats-Expected-Stream": "OTHER", "nats-expected-last-sequence": "1",
		"NATS-EXPECTED-LAST-SUBJECT-SEQUENCE": "7", "Status": "404", "tenant": "t1",
	}
	if got, err := publishAlone(t, s, []*event.Event{hostile}); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("the event with JetStream headers: %v (err %v)", got, err)
	}
	msgs := storedMsgs(t, s)
	if len(msgs) != 4 {
		t.Fatalf("the stream holds %d messages, want the 3 earlier ones and the new one", len(msgs))
	}
	h := msgs[3].Headers()
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "nats-") && k != jetstream.MsgIDHeader || k == "Status" {
			t.Errorf("the row header %s: %v reached the stream", k, h[k])
		}
	}
	if h.Get("tenant") != "t1" {
		t.Errorf("the row header tenant was not forwarded: %v", h)
	}
	if n := drops.Count(sink.DropControl); n != 6 {
		t.Errorf("%d control headers counted as dropped, want 6", n)
	}
}

// TestReservedHeaderCaseVariants: a row header named like a header the
// relay sets, in any case, is never sent beside the real one.
func TestReservedHeaderCaseVariants(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	drops := sink.NewHeaderDrops(nil)
	s := newStreamSink(t, srv.URL(), Options{HeaderDrops: drops})
	e := testEvent(1, "order", "1")
	e.Headers = map[string]string{"nats-msg-id": "evil7", "MESSAGE_ID": "evil8", "Event_Type": "evil", "content-type": "evil",
		"Idempotency-Key": "evil", "user-agent": "evil", "Webhook-Signature": "evil", "x": "y"}
	if got, err := publishAlone(t, s, []*event.Event{e}); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("classes %v (err %v)", got, err)
	}
	msgs := storedMsgs(t, s)
	if len(msgs) != 1 {
		t.Fatalf("the stream holds %d messages, want 1", len(msgs))
	}
	for k, v := range msgs[0].Headers() {
		if slices.Contains(v, "evil") || slices.Contains(v, "evil7") || slices.Contains(v, "evil8") {
			t.Errorf("the row header %s: %v was sent", k, v)
		}
	}
	if n := drops.Count(sink.DropReserved); n != 7 {
		t.Errorf("%d reserved headers counted as dropped, want 7", n)
	}
}

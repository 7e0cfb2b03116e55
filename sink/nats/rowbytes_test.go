package nats

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
)

// FuzzRowBytes publishes, to an embedded JetStream server, an event whose
// aggregate_type, aggregate_id, event_type and one row header hold any
// bytes, between two plain events. The subject and headers are built from
// them; the event is stored or fails as its own fault (permanent), its
// neighbours are stored, and the connection stays up.
func FuzzRowBytes(f *testing.F) {
	srv := startServer(f, testenv.NATSOptions{})
	s := newStreamSink(f, srv.URL(), Options{})
	for _, v := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a\r\nNats-Rollup: sub", "\u202e\u009b", "", "a.b*>", " "} {
		f.Add(v, v, v, "X-"+v, v)
	}
	n := 0
	f.Fuzz(func(t *testing.T, typ, id, evType, hk, hv string) {
		n += 3
		odd := &event.Event{ID: fmt.Sprintf("00000000-0000-4000-9000-%012d", n), AggregateType: typ, AggregateID: id,
			EventType: evType, Headers: map[string]string{hk: hv}, Payload: []byte(`{}`), ContentType: event.ContentTypeJSON}
		batch := []*event.Event{testEvent(n+1, "order", "a"), odd, testEvent(n+2, "order", "b")}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := s.Publish(ctx, batch)
		for i := range batch {
			ferr := sink.Failed(err, i)
			if ferr != nil && (i != 1 || fault.ClassOf(ferr) != fault.Permanent) {
				t.Fatalf("event %d: %v (%s)", i, ferr, fault.ClassOf(ferr))
			}
		}
		if !s.nc.IsConnected() {
			t.Fatalf("connection %v after the publish", s.nc.Status())
		}
	})
}

// TestControlBytesInHeaderValues checks that an event whose row header
// value holds a NUL or another control byte fails as its own fault
// (permanent, naming the header) and is not stored, while a tab passes and
// the neighbours are stored.
func TestControlBytesInHeaderValues(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	for i, v := range []string{"a\x00b", "bell\x07", "del\x7f"} {
		odd := testEvent(10*i+2, "order", "odd")
		odd.Headers = map[string]string{"X-Tenant": v}
		tab := testEvent(10*i+3, "order", "tab")
		tab.Headers = map[string]string{"X-Tenant": "a\tb"}
		batch := []*event.Event{testEvent(10*i+1, "order", "a"), odd, tab}
		err := s.Publish(context.Background(), batch)
		ferr := sink.Failed(err, 1)
		if fault.ClassOf(ferr) != fault.Permanent || !strings.Contains(fmt.Sprint(ferr), "X-Tenant") {
			t.Errorf("header value %q: %v (%s), want a permanent failure naming the header", v, ferr, fault.ClassOf(ferr))
		}
		for _, j := range []int{0, 2} {
			if ferr := sink.Failed(err, j); ferr != nil {
				t.Errorf("neighbour %d: %v", j, ferr)
			}
		}
	}
	if n := len(storedMsgs(t, s)); n != 6 {
		t.Errorf("%d messages stored, want the 6 neighbours", n)
	}
}

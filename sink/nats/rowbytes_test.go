package nats

import (
	"context"
	"fmt"
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

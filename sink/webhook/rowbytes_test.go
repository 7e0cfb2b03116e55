package webhook

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// FuzzRowBytes POSTs, to a real HTTP server, an event whose
// aggregate_type, aggregate_id, event_type and one row header hold any
// bytes: the URL and headers are built from them, and the publish is either
// acknowledged or fails as the event's fault (permanent), never as a broken
// receiver, which would hold every event of the URL.
func FuzzRowBytes(f *testing.F) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	f.Cleanup(srv.Close)
	snk, err := New(Config{URL: srv.URL + "/events/{aggregate_type}/{aggregate_id}?type={event_type}"}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { snk.Close() })
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a\r\nInjected: 1", "\u202e\u009b", "", "..", "?#%"} {
		f.Add(s, s, s, "X-"+s, s)
	}
	f.Fuzz(func(t *testing.T, typ, id, evType, hk, hv string) {
		e := &event.Event{ID: "8d0f3c1e-6f2b-4c4e-9a39-5b1c2d3e4f50", AggregateType: typ, AggregateID: id, EventType: evType,
			Headers: map[string]string{hk: hv}, Payload: []byte(`{}`), ContentType: event.ContentTypeJSON}
		err := sink.Failed(snk.Publish(context.Background(), []*event.Event{e}), 0)
		if err != nil && fault.ClassOf(err) != fault.Permanent {
			t.Fatalf("%v (%s), want acknowledged or permanent", err, fault.ClassOf(err))
		}
	})
}

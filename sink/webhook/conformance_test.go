package webhook

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	whsig "github.com/outboxrelay/relay/helpers/webhook"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// confMaxBytes is the conformance receiver's body limit: a larger body gets
// 413 Content Too Large.
const confMaxBytes = 256 * 1024

const confSecret = "conformance-secret-of-32-bytes.."

// confVerifier checks the conformance suite's requests as a receiver would.
var confVerifier, _ = whsig.NewVerifier(confSecret)

// confReceiver is a webhook receiver that stores what it receives across
// stops and restarts on one address. The first path segment is the
// suite's scope; requests of a stalled scope are never answered.
type confReceiver struct {
	addr string

	mu      sync.Mutex
	msgs    map[string][]sinktest.Message // by scope, in arrival order
	stalled map[string]bool
	srv     *http.Server
}

func startConfReceiver(t *testing.T) *confReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &confReceiver{addr: l.Addr().String(), msgs: map[string][]sinktest.Message{}, stalled: map[string]bool{}}
	c.serve(l)
	t.Cleanup(c.stop)
	return c
}

func (c *confReceiver) serve(l net.Listener) {
	srv := &http.Server{Handler: c}
	c.mu.Lock()
	c.srv = srv
	c.mu.Unlock()
	go srv.Serve(l)
}

func (c *confReceiver) stop() {
	c.mu.Lock()
	srv := c.srv
	c.srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

func (c *confReceiver) start(t *testing.T) {
	t.Helper()
	var l net.Listener
	var err error
	for range 50 { // the port may linger for a moment
		if l, err = net.Listen("tcp", c.addr); err == nil {
			c.serve(l)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("restart the receiver on %s: %v", c.addr, err)
}

func (c *confReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	scope, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	c.mu.Lock()
	stalled := c.stalled[scope]
	c.mu.Unlock()
	if stalled {
		<-r.Context().Done()
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, confMaxBytes))
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			http.Error(w, "body over 256 KiB", http.StatusRequestEntityTooLarge)
		}
		return
	}
	m := sinktest.Message{
		// The decoded path: the values the template received, before the
		// sink escaped them for the URL.
		Destination: "http://" + c.addr + r.URL.Path,
		Headers:     r.Header.Clone(),
		Payload:     body,
		Raw:         r.URL.EscapedPath(),
	}
	c.mu.Lock()
	c.msgs[scope] = append(c.msgs[scope], m)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// TestConformance runs the shared sink conformance suite against an HTTP
// receiver. Every request is signed and checked with the helpers' verifier.
func TestConformance(t *testing.T) {
	rc := startConfReceiver(t)
	newConfSink := func(t *testing.T, tmpl string, timeout time.Duration) sink.Sink {
		t.Helper()
		s, err := New(Config{
			URL: tmpl, Timeout: timeout, Secret: confSecret,
			Headers: map[string]string{"Authorization": "Bearer conformance"},
		}, Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink {
			return newConfSink(t, tmpl, 5*time.Second)
		},
		Received: func(t *testing.T, scope string) []sinktest.Message {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			return append([]sinktest.Message(nil), rc.msgs[scope]...)
		},
		Template: func(scope, suffix string) string {
			return "http://" + rc.addr + "/" + scope + "/" + suffix
		},
		// Values are URL-escaped, not replaced: the decoded path holds them
		// unchanged.
		Sanitize: nil,
		Stop:     func(t *testing.T) { rc.stop() },
		Start:    func(t *testing.T) { rc.start(t) },
		NewStalled: func(t *testing.T, scope, tmpl string) sink.Sink {
			rc.mu.Lock()
			rc.stalled[scope] = true
			rc.mu.Unlock()
			return newConfSink(t, tmpl, time.Minute)
		},
		MaxMessageBytes: confMaxBytes,
		Inspect: func(t *testing.T, e *event.Event, m sinktest.Message) {
			h := http.Header(m.Headers)
			if err := confVerifier.Verify(h, m.Payload); err != nil {
				t.Errorf("event %s: %v", e.ID, err)
			}
			if got := h.Get("Authorization"); got != "Bearer conformance" {
				t.Errorf("event %s: Authorization %q", e.ID, got)
			}
		},
		Skip: map[string]string{
			// HTTP header values cannot carry CR, LF or other control
			// characters (the sink sends them as spaces, see
			// TestOddHeaderValues), and receivers trim leading and
			// trailing whitespace.
			"headers/odd_values": "HTTP header values cannot carry control characters and lose surrounding whitespace; the sink sends control characters as spaces",
		},
		Features: sinktest.Features{
			IDHeaders:              []string{HeaderIdempotencyKey},
			ContentTypeHeader:      "Content-Type",
			CaseInsensitiveHeaders: true,
			Control:                sink.HTTPRules,
		},
	})
}

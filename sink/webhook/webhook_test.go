package webhook

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// request is one request a test receiver got.
type request struct {
	Method  string
	Path    string // decoded
	RawPath string // as sent, escaped
	Query   string
	Header  http.Header
	Body    []byte
}

// receiver is an httptest server that records requests and answers them
// with handle, or 200 when handle is nil.
type receiver struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []request
	handle   func(w http.ResponseWriter, r *http.Request, n int) // n: 1-based request count
	newConns atomic.Int32
	count    atomic.Int32
}

func newReceiver(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *receiver {
	t.Helper()
	rc := &receiver{handle: handle}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, request{
			Method: r.Method, Path: r.URL.Path, RawPath: r.URL.EscapedPath(), Query: r.URL.RawQuery,
			Header: r.Header.Clone(), Body: body,
		})
		rc.mu.Unlock()
		n := int(rc.count.Add(1))
		r.Body = io.NopCloser(bytes.NewReader(body)) // for handle to read again
		if rc.handle != nil {
			rc.handle(w, r, n)
		}
	}))
	rc.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			rc.newConns.Add(1)
		}
	}
	rc.Start()
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.reqs)
}

func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testEvent(n int, aggregateID string) *event.Event {
	return &event.Event{
		ID:            fmt.Sprintf("00000000-0000-4000-8000-%012d", n),
		AggregateType: "order",
		AggregateID:   aggregateID,
		EventType:     "created",
		Payload:       fmt.Appendf(nil, `{"n": %d}`, n),
		ContentType:   event.ContentTypeJSON,
	}
}

// testEvents returns n events of n different aggregates.
func testEvents(n int) []*event.Event {
	batch := make([]*event.Event, n)
	for i := range batch {
		batch[i] = testEvent(i, fmt.Sprint("a", i))
	}
	return batch
}

func TestPublishRequest(t *testing.T) {
	rc := newReceiver(t, nil)
	s := newSink(t, Config{
		URL:     rc.URL + "/in/{aggregate_type}/{aggregate_id}?type={event_type}",
		Headers: map[string]string{"Authorization": "Bearer t0k", "X-Static": "s"},
	})
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	batch := []*event.Event{
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1,  "b":[true]}`), ContentType: event.ContentTypeJSON,
			Headers: map[string]string{
				"trace_id": "t-1", "traceparent": "00-abc-def-01",
				// Contract, static and hop-by-hop headers a row cannot set.
				"message_id": "spoofed", "IDEMPOTENCY-KEY": "spoofed", "content-type": "text/html",
				"Authorization": "spoofed", "Connection": "close", "Host": "evil", "Transfer-Encoding": "chunked",
				"Webhook-Signature": "spoofed",
			},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f61", AggregateType: "bin/v1", AggregateID: "b 2/../x?#%",
			EventType: "a&b=c d", Payload: binary, ContentType: event.ContentTypeBinary,
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f62", AggregateType: "", AggregateID: "..",
			EventType: "empty", Payload: []byte{}, ContentType: event.ContentTypeText,
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f63", AggregateType: "ü", AggregateID: "x",
			EventType: "no-content-type", Payload: []byte("x"),
		},
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}

	reqs := rc.requests()
	if len(reqs) != len(batch) {
		t.Fatalf("receiver got %d requests, want %d", len(reqs), len(batch))
	}
	byID := map[string]request{}
	for _, r := range reqs {
		byID[r.Header.Get("Idempotency-Key")] = r
	}
	paths := []struct{ raw, query string }{
		{"/in/order/o-1", "type=order.created"},
		{"/in/bin%2Fv1/b%202%2F..%2Fx%3F%23%25", "type=a%26b%3Dc+d"},
		{"/in/" + template.Hash("") + "/%2E%2E", "type=empty"},
		{"/in/%C3%BC/x", "type=no-content-type"},
	}
	contentTypes := []string{event.ContentTypeJSON, event.ContentTypeBinary, event.ContentTypeText, event.ContentTypeBinary}
	for i, e := range batch {
		r, ok := byID[e.ID]
		if !ok {
			t.Fatalf("no request with Idempotency-Key %s", e.ID)
		}
		if r.Method != http.MethodPost {
			t.Errorf("event %d: method %s", i, r.Method)
		}
		if r.RawPath != paths[i].raw || r.Query != paths[i].query {
			t.Errorf("event %d: path %q query %q, want %q %q", i, r.RawPath, r.Query, paths[i].raw, paths[i].query)
		}
		if !bytes.Equal(r.Body, e.Payload) {
			t.Errorf("event %d: body %q, want %q", i, r.Body, e.Payload)
		}
		want := http.Header{
			"Idempotency-Key": {e.ID},
			"Message_id":      {e.ID},
			"Event_type":      {e.EventType},
			"Aggregate_type":  {e.AggregateType},
			"Aggregate_id":    {e.AggregateID},
			"Content-Type":    {contentTypes[i]},
			"Authorization":   {"Bearer t0k"},
			"X-Static":        {"s"},
			"User-Agent":      {"outbox-relay"},
			"Accept-Encoding": {"gzip"},
			"Content-Length":  {strconv.Itoa(len(e.Payload))},
		}
		if i == 0 {
			want["Trace_id"] = []string{"t-1"}
			want["Traceparent"] = []string{"00-abc-def-01"}
		}
		if !maps.EqualFunc(r.Header, want, slices.Equal) {
			t.Errorf("event %d: headers\n%v\nwant\n%v", i, r.Header, want)
		}
	}
}

// TestWireHeaderNames reads a request off the wire to check that the
// contract's header names are sent as the contract spells them.
func TestWireHeaderNames(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	head := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var b strings.Builder
		for {
			line, err := br.ReadString('\n')
			b.WriteString(line)
			if err != nil || line == "\r\n" {
				break
			}
		}
		head <- b.String()
		io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
	}()
	s := newSink(t, Config{URL: "http://" + l.Addr().String() + "/hook"})
	if err := s.Publish(context.Background(), testEvents(1)); err != nil {
		t.Fatal(err)
	}
	h := <-head
	for _, want := range []string{"\r\nIdempotency-Key: ", "\r\nmessage_id: ", "\r\nevent_type: created\r\n", "\r\naggregate_type: order\r\n", "\r\naggregate_id: a0\r\n", "\r\nContent-Type: application/json\r\n"} {
		if !strings.Contains(h, want) {
			t.Errorf("request head lacks %q:\n%s", want, h)
		}
	}
}

// TestFailThenSucceed answers 500 first, then 200: the retried copy carries
// the same Idempotency-Key and message_id.
func TestFailThenSucceed(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			http.Error(w, "database\x00 down", http.StatusInternalServerError)
		}
	})
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	batch := testEvents(1)

	err := s.Publish(context.Background(), batch)
	if got := sinktest.Classes(err, 1); got[0] != "suspect-transient" {
		t.Fatalf("first publish: classes %v (err %v)", got, err)
	}
	var se *StatusError
	if !errors.As(sink.Failed(err, 0), &se) || se.StatusCode != 500 {
		t.Fatalf("err %v is not a *StatusError with 500", err)
	}
	msg := sink.Failed(err, 0).Error()
	for _, want := range []string{batch[0].ID, rc.URL + "/a0", "500 Internal Server Error", "database  down"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatalf("second publish: %v", err)
	}
	reqs := rc.requests()
	if len(reqs) != 2 {
		t.Fatalf("receiver got %d requests, want 2", len(reqs))
	}
	for _, r := range reqs {
		if r.Header.Get("Idempotency-Key") != batch[0].ID || r.Header.Get("message_id") != batch[0].ID {
			t.Errorf("copy with Idempotency-Key %q, message_id %q; want %s", r.Header.Get("Idempotency-Key"), r.Header.Get("message_id"), batch[0].ID)
		}
	}
}

func TestStatusClasses(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "http://user:pw@elsewhere/?token=abc")
		}
		w.WriteHeader(code)
	})
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	want := map[int]string{
		200: "ok", 201: "ok", 202: "ok", 204: "ok",
		301: "unavailable", 302: "unavailable", 303: "unavailable", 307: "unavailable", 308: "unavailable",
		400: "suspect-permanent", 413: "suspect-permanent", 414: "suspect-permanent", 422: "suspect-permanent", 431: "suspect-permanent",
		409: "suspect-transient", 415: "suspect-transient", 500: "suspect-transient",
		401: "unavailable", 403: "unavailable", 404: "unavailable", 405: "unavailable", 407: "unavailable",
		408: "unavailable", 410: "unavailable", 429: "unavailable",
		501: "unavailable", 502: "unavailable", 503: "unavailable", 504: "unavailable", 505: "unavailable",
	}
	codes := slices.Sorted(maps.Keys(want))
	batch := make([]*event.Event, len(codes))
	for i, c := range codes {
		batch[i] = testEvent(i, strconv.Itoa(c))
	}
	err := s.Publish(context.Background(), batch)
	got := sinktest.Classes(err, len(batch))
	for i, c := range codes {
		if got[i] != want[c] {
			t.Errorf("status %d: class %s, want %s (%v)", c, got[i], want[c], sink.Failed(err, i))
		}
	}
	if n := len(rc.requests()); n != len(codes) {
		t.Errorf("receiver got %d requests, want %d: a redirect was followed", n, len(codes))
	}
	msg := sink.Failed(err, slices.Index(codes, 302)).Error()
	if !strings.Contains(msg, "not followed") || strings.Contains(msg, "pw") || strings.Contains(msg, "abc") {
		t.Errorf("redirect error %q", msg)
	}
}

// TestRetryAfter: a 429 with Retry-After from one URL pauses that URL only:
// its next requests fail at once as unavailable without being sent, while
// the other URLs of the template keep receiving; once the pause passed, the
// URL receives again.
func TestRetryAfter(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	paused := testEvent(0, "slow")
	start := time.Now()
	err := s.Publish(context.Background(), []*event.Event{paused})
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" {
		t.Fatalf("classes %v (err %v)", got, err)
	}
	var ra interface{ RetryAfter() time.Duration }
	if !errors.As(sink.Failed(err, 0), &ra) || ra.RetryAfter() != 2*time.Second {
		t.Fatalf("err %v carries no 2s RetryAfter", err)
	}
	if !strings.Contains(err.Error(), "retry after 2s") {
		t.Errorf("error %q does not mention the delay", err)
	}
	// Other URLs go on at once; the paused one fails without a request.
	others := testEvents(3)
	err = s.Publish(context.Background(), append([]*event.Event{paused}, others...))
	if got := sinktest.Classes(err, 4); !slices.Equal(got, []string{"unavailable", "ok", "ok", "ok"}) {
		t.Fatalf("classes %v (err %v), want the paused URL unavailable and the others delivered", got, err)
	}
	if !strings.Contains(sink.Failed(err, 0).Error(), "not sent") {
		t.Errorf("paused error %q", sink.Failed(err, 0))
	}
	if d := time.Since(start); d >= 2*time.Second {
		t.Fatalf("the other URLs took %v, as long as the pause", d)
	}
	if n := len(rc.requests()); n != 4 {
		t.Fatalf("receiver got %d requests, want 4: a request reached the paused URL", n)
	}
	waitUntil(t, 10*time.Second, func() bool {
		return s.Publish(context.Background(), []*event.Event{paused}) == nil
	})
	if d := time.Since(start); d < 1900*time.Millisecond {
		t.Errorf("the paused URL received again %v after the 429, want ≥ 2s", d)
	}
}

func TestRetryAfter503(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	s := newSink(t, Config{URL: rc.URL})
	err := s.Publish(context.Background(), testEvents(1))
	var se *StatusError
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" || !errors.As(sink.Failed(err, 0), &se) || se.Delay < time.Second || se.Delay > 3*time.Second {
		t.Fatalf("classes %v, err %v", got, err)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"0":                             0,
		" 7 ":                           7 * time.Second,
		"86400":                         MaxRetryAfter,
		"99999999999999999999":          -1,
		"-1":                            -1,
		"":                              -1,
		"soon":                          -1,
		"Thu, 02 Jan 2025 03:04:35 GMT": 30 * time.Second,
		"Thu, 02 Jan 2025 03:00:00 GMT": 0,
	} {
		got, ok := parseRetryAfter(v, now)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

// stallingReceiver never answers until the test ends.
func stallingReceiver(t *testing.T) *receiver {
	release := make(chan struct{})
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) }) // runs before rc.Close
	return rc
}

// settleGoroutines waits for the goroutine count to fall to at most n.
func settleGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTimeout(t *testing.T) {
	before := runtime.NumGoroutine()
	rc := stallingReceiver(t)
	s, err := New(Config{URL: rc.URL + "/{aggregate_id}", Timeout: 200 * time.Millisecond}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Publish(context.Background(), testEvents(20))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Publish took %v with a 200ms timeout", d)
	}
	for i, c := range sinktest.Classes(err, 20) {
		if c != "unavailable" {
			t.Fatalf("event %d: class %s (%v)", i, c, sink.Failed(err, i))
		}
	}
	if msg := sink.Failed(err, 0).Error(); !strings.Contains(msg, "no response within 200ms (sink.webhook.timeout)") {
		t.Errorf("error %q does not name the timeout", msg)
	}
	if !errors.Is(sink.Failed(err, 0), context.DeadlineExceeded) {
		t.Errorf("error %v is not a DeadlineExceeded", err)
	}
	s.Close()
	rc.CloseClientConnections()
	settleGoroutines(t, before+8) // the receiver's own goroutines end with the test
}

func TestCancel(t *testing.T) {
	rc := stallingReceiver(t)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}", Timeout: time.Minute})

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Publish(ctx, testEvents(3))
	if got := sinktest.Classes(err, 3); !slices.Equal(got, []string{"unavailable", "unavailable", "unavailable"}) || !errors.Is(sink.Failed(err, 2), context.Canceled) {
		t.Fatalf("cancelled before: classes %v (err %v)", got, err)
	}
	if n := len(rc.requests()); n != 0 {
		t.Errorf("a cancelled publish sent %d requests", n)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err = s.Publish(ctx, testEvents(100)) // more than max_concurrency: some wait for a slot
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after the cancel", d-200*time.Millisecond)
	}
	for i, c := range sinktest.Classes(err, 100) {
		if c != "unavailable" || !errors.Is(sink.Failed(err, i), context.Canceled) {
			t.Fatalf("event %d: class %s (%v)", i, c, sink.Failed(err, i))
		}
	}
}

func TestClose(t *testing.T) {
	rc := stallingReceiver(t)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}", Timeout: time.Minute, MaxConcurrency: 2})
	time.AfterFunc(200*time.Millisecond, func() { s.Close() })
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(5))
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after Close", d-200*time.Millisecond)
	}
	for i, c := range sinktest.Classes(err, 5) {
		if c != "unavailable" || !errors.Is(sink.Failed(err, i), errClosed) {
			t.Errorf("event %d: class %s (%v)", i, c, sink.Failed(err, i))
		}
	}
	err = s.Publish(context.Background(), testEvents(1))
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" {
		t.Errorf("publish after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestKeepAlive publishes many batches and checks that connections are
// reused: no more are opened than requests are ever in flight at once.
func TestKeepAlive(t *testing.T) {
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(2 * time.Millisecond)
		if n%3 == 0 {
			http.Error(w, strings.Repeat("failure ", 100), http.StatusInternalServerError)
		}
	})
	const conc = 8
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}", MaxConcurrency: conc})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for r := range 20 {
				batch := make([]*event.Event, 10)
				for i := range batch {
					batch[i] = testEvent((w*20+r)*10+i, fmt.Sprint(w, "-", i))
				}
				_ = s.Publish(context.Background(), batch)
			}
		})
	}
	wg.Wait()
	if got := rc.count.Load(); got != 400 {
		t.Fatalf("receiver got %d requests, want 400", got)
	}
	if n := rc.newConns.Load(); n > conc {
		t.Errorf("%d connections for 400 requests, want at most %d", n, conc)
	}
	t.Logf("400 requests over %d connections", rc.newConns.Load())
}

// TestParallel checks that the events of a batch are in flight at once, up
// to max_concurrency across all Publish calls.
func TestParallel(t *testing.T) {
	var inFlight, peak atomic.Int32
	handle := func(w http.ResponseWriter, r *http.Request, _ int) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(50 * time.Millisecond)
	}

	rc := newReceiver(t, handle)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	start := time.Now()
	if err := s.Publish(context.Background(), testEvents(40)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("40 requests of 50ms took %v: not parallel", d)
	}
	if p := peak.Load(); p < 20 {
		t.Errorf("at most %d requests in flight, want about 40", p)
	}

	peak.Store(0)
	rc2 := newReceiver(t, handle)
	s2 := newSink(t, Config{URL: rc2.URL + "/{aggregate_id}", MaxConcurrency: 4})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := s2.Publish(context.Background(), testEvents(8)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p != 4 {
		t.Errorf("%d requests in flight at most, want max_concurrency 4", p)
	}
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	for _, url := range []string{"http://alice:s3cret@" + addr + "/x?token=s3cret", "http://relay-test.invalid/x"} {
		s := newSink(t, Config{URL: url, Timeout: 2 * time.Second})
		err := s.Publish(context.Background(), testEvents(2))
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{"unavailable", "unavailable"}) {
			t.Errorf("%s: classes %v (err %v)", url, got, err)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "alice") {
			t.Errorf("error leaks credentials: %v", err)
		}
		err = s.Check(context.Background())
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Check(%s) = %v", url, err)
		}
		t.Logf("Check: %v", err)
	}
}

func TestCheck(t *testing.T) {
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_type}"})
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := rc.count.Load(); n != 0 {
		t.Errorf("Check sent %d requests", n)
	}
	s = newSink(t, Config{URL: strings.Replace(rc.URL, "127.0.0.1", "localhost", 1) + "/x"})
	if err := s.Check(context.Background()); err != nil {
		t.Errorf("Check via localhost: %v", err)
	}
	s = newSink(t, Config{URL: "https://relay-test.invalid/{aggregate_type}"})
	if err := s.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "relay-test.invalid does not resolve") {
		t.Errorf("Check on an unknown host: %v", err)
	}
}

func TestOddHeaderValues(t *testing.T) {
	rc := newReceiver(t, nil)
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	batch := testEvents(3)
	batch[1].Headers = map[string]string{"bad name": "v"}
	batch[2].Headers = map[string]string{"x-a": "line\r\nInjected: 1", "x-b": "tab\tctl\x01\x7f"}
	batch[2].EventType = "a\nb"
	batch[2].AggregateID = "id\r\n"
	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 3), []string{"ok", "permanent", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	reqs := rc.requests()
	if len(reqs) != 2 {
		t.Fatalf("receiver got %d requests, want 2", len(reqs))
	}
	r := reqs[0]
	if r.Header.Get("Idempotency-Key") != batch[2].ID {
		r = reqs[1]
	}
	for k, want := range map[string]string{"X-A": "line  Injected: 1", "X-B": "tab\tctl", "Event_type": "a b", "Aggregate_id": "id"} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if r.Header.Get("Injected") != "" {
		t.Error("a CR LF injected a header")
	}
	if r.Path != "/id\r\n" {
		t.Errorf("path %q, want the aggregate_id unchanged", r.Path)
	}
}

func TestNewErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "sink.webhook.url: required"},
		{Config{URL: "http://h/{id}"}, "unknown placeholder {id}"},
		{Config{URL: "h/{aggregate_id}"}, "an absolute http or https URL"},
		{Config{URL: "ftp://h/"}, "the scheme must be http or https"},
		{Config{URL: "https://{aggregate_type}.example.com/"}, "not in the scheme or host"},
		{Config{URL: "https://tok@h:{aggregate_id}/"}, "not in the scheme or host"},
		{Config{URL: "http:///x"}, "no host"},
		{Config{URL: "http://h/#{event_type}"}, "fragment"},
		{Config{URL: "http://h/", Headers: map[string]string{"Idempotency-Key": "x"}}, "sink.webhook.headers.Idempotency-Key: Idempotency-Key is set by the relay"},
		{Config{URL: "http://h/", Headers: map[string]string{"a b": "x"}}, "not a valid HTTP header name"},
		{Config{URL: "http://h/", Headers: map[string]string{"X": "\n"}}, "control character"},
		{Config{URL: "http://h/", MaxConcurrency: -1}, "max_concurrency"},
	} {
		_, err := New(c.cfg, Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", c.cfg, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "tok") {
			t.Errorf("error leaks credentials: %v", err)
		}
	}
}

// TestProbe: without health_url, or for an event's URL, there is nothing
// to probe; with health_url, a GET carrying the static headers decides,
// and a non-2xx answer is a failure of the destination.
func TestProbe(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.Method != http.MethodGet || r.URL.Path != "/health" || r.Header.Get("Authorization") != "Bearer t" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if !healthy.Load() {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	ctx := context.Background()
	plain := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	if err := plain.Probe(ctx, sink.Broker); !errors.Is(err, sink.ErrNoProbe) {
		t.Errorf("Probe without health_url = %v, want ErrNoProbe", err)
	}
	s := newSink(t, Config{URL: "http://user:pw@" + strings.TrimPrefix(rc.URL, "http://") + "/{aggregate_id}",
		HealthURL: rc.URL + "/health", Headers: map[string]string{"Authorization": "Bearer t"}})
	dest := s.DestinationOf(testEvent(1, "a1"))
	if strings.Contains(dest, "pw") || !strings.HasSuffix(dest, "/a1") {
		t.Errorf("DestinationOf = %q, want the URL with its password masked", dest)
	}
	if err := s.Probe(ctx, dest); !errors.Is(err, sink.ErrNoProbe) {
		t.Errorf("Probe(%s) = %v, want ErrNoProbe", dest, err)
	}
	if err := s.Probe(ctx, sink.Broker); err != nil {
		t.Errorf("Probe = %v", err)
	}
	healthy.Store(false)
	if err := s.Probe(ctx, sink.Broker); fault.ClassOf(err) != fault.Unavailable || !strings.Contains(err.Error(), "401") {
		t.Errorf("Probe of an unhealthy receiver = %v, want unavailable naming 401", err)
	}
}

// waitUntil polls ok every 50ms until it holds, failing the test after d.
func waitUntil(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

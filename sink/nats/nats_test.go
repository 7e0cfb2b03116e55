package nats

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

func startServer(t testing.TB, opts testenv.NATSOptions) *testenv.NATS {
	t.Helper()
	srv, err := testenv.StartNATS(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func newSink(t testing.TB, url, subject string, opts Options) *Sink {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	s, err := New(context.Background(), Config{URL: url, Subject: subject, Stream: "OUTBOX"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStreamSink returns a sink on outbox.{aggregate_type} whose stream
// OUTBOX exists.
func newStreamSink(t testing.TB, url string, opts Options) *Sink {
	t.Helper()
	s := newSink(t, url, "outbox.{aggregate_type}", opts)
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func testEvent(n int, aggregateType, aggregateID string) *event.Event {
	return &event.Event{
		ID:            fmt.Sprintf("00000000-0000-4000-8000-%012d", n),
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		EventType:     "created",
		Payload:       fmt.Appendf(nil, `{"n": %d}`, n),
		ContentType:   event.ContentTypeJSON,
	}
}

func testEvents(n int, aggregates int) []*event.Event {
	batch := make([]*event.Event, n)
	for i := range batch {
		batch[i] = testEvent(i, "order", fmt.Sprint(i%aggregates))
	}
	return batch
}

func stream(t *testing.T, s *Sink) jetstream.Stream {
	t.Helper()
	str, err := s.js.Stream(context.Background(), "OUTBOX")
	if err != nil {
		t.Fatal(err)
	}
	return str
}

// storedMsgs returns every message of the stream, in stream order.
func storedMsgs(t *testing.T, s *Sink) []jetstream.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	str := stream(t, s)
	info, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := str.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for uint64(len(msgs)) < info.State.Msgs {
		batch, err := cons.Fetch(int(info.State.Msgs)-len(msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("read stream: %v", err)
		}
	}
	return msgs
}

func TestPublishHeadersAndPayload(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	batch := []*event.Event{
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1,  "b":[true]}`), ContentType: event.ContentTypeJSON,
			Headers: map[string]string{"trace_id": "t-1", "message_id": "spoofed", "Nats-Msg-Id": "spoofed"},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f61", AggregateType: "bin.v1 *>\x01", AggregateID: "b 2",
			EventType: "blob", Payload: binary, ContentType: event.ContentTypeBinary,
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f62", AggregateType: "", AggregateID: "e",
			EventType: "empty", Payload: []byte{}, ContentType: event.ContentTypeText,
		},
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}

	msgs := storedMsgs(t, s)
	if len(msgs) != len(batch) {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), len(batch))
	}
	subjects := []string{"outbox.order", "outbox.bin_v1____" + template.Hash("bin.v1 *>\x01"), "outbox." + template.Hash("")}
	for i, m := range msgs {
		e := batch[i]
		if m.Subject() != subjects[i] {
			t.Errorf("message %d: subject %q, want %q", i, m.Subject(), subjects[i])
		}
		if !bytes.Equal(m.Data(), e.Payload) {
			t.Errorf("message %d: payload %q, want %q", i, m.Data(), e.Payload)
		}
		want := nats.Header{
			"Nats-Msg-Id":    {e.ID},
			"message_id":     {e.ID},
			"event_type":     {e.EventType},
			"aggregate_type": {e.AggregateType},
			"aggregate_id":   {e.AggregateID},
			"Content-Type":   {e.ContentType},
		}
		if e.Headers["trace_id"] != "" {
			want["trace_id"] = []string{"t-1"}
		}
		if !maps.EqualFunc(m.Headers(), want, slices.Equal) {
			t.Errorf("message %d: headers %v, want %v", i, m.Headers(), want)
		}
	}
}

func TestPublishDeduplicatesByMsgID(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	e := testEvent(1, "order", "1")
	for range 3 {
		if err := s.Publish(context.Background(), []*event.Event{e}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(storedMsgs(t, s)); n != 1 {
		t.Fatalf("stream holds %d messages, want 1", n)
	}
}

// TestPublishManyAggregates publishes rounds of one event per aggregate from
// several goroutines, through an in-flight window much smaller than a batch,
// and checks that each aggregate's events are stored in order.
func TestPublishManyAggregates(t *testing.T) {
	const workers, aggregates, rounds = 4, 250, 20
	srv := startServer(t, testenv.NATSOptions{})
	// A full window waits for acks up to AckTimeout: generous, so that a
	// machine slowed by the race detector and other load does not fail it.
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}.{aggregate_id}", Options{MaxInFlight: 64, AckTimeout: time.Minute})
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				batch := make([]*event.Event, aggregates)
				for a := range batch {
					n := (w*rounds+r)*aggregates + a
					batch[a] = testEvent(n, "order", fmt.Sprintf("w%d-a%d", w, a))
					batch[a].Payload = fmt.Append(nil, r)
				}
				if err := s.Publish(context.Background(), batch); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	msgs := storedMsgs(t, s)
	if len(msgs) != workers*aggregates*rounds {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), workers*aggregates*rounds)
	}
	next := map[string]int{}
	for _, m := range msgs {
		if got := string(m.Data()); got != fmt.Sprint(next[m.Subject()]) {
			t.Fatalf("%s: round %s stored when round %d was due", m.Subject(), got, next[m.Subject()])
		}
		next[m.Subject()]++
	}
}

func TestSubjectPattern(t *testing.T) {
	for tmpl, want := range map[string]string{
		"outbox.{aggregate_type}":                  "outbox.*",
		"events.orders-{event_type}":               "events.*",
		"{aggregate_type}.{event_type}.x":          "*.*.x",
		"outbox.{aggregate_type}-{aggregate_id}.z": "outbox.*.z",
		"fixed.subject":                            "fixed.subject",
	} {
		got, err := subjectPattern(tmpl)
		if err != nil || got != want {
			t.Errorf("subjectPattern(%q) = %q, %v; want %q", tmpl, got, err, want)
		}
	}
	for _, tmpl := range []string{"", "outbox.", "outbox..x", "outbox.*", "outbox.>", "out box.{event_type}", "a.b*{event_type}"} {
		if got, err := subjectPattern(tmpl); err == nil {
			t.Errorf("subjectPattern(%q) = %q, want an error", tmpl, got)
		}
	}
}

func TestSubsetOf(t *testing.T) {
	for _, c := range []struct {
		pattern, filter string
		want            bool
	}{
		{"outbox.*", "outbox.*", true},
		{"outbox.*", "outbox.>", true},
		{"outbox.*", ">", true},
		{"outbox.*", "*.*", true},
		{"outbox.*", "outbox.order", false},
		{"outbox.*", "outbox.*.*", false},
		{"outbox.*", "outbox", false},
		{"outbox", "outbox.>", false},
		{"outbox.*", "other.*", false},
		{"a.b", "a.b", true},
		{"a.b", "a.*", true},
	} {
		if got := subsetOf(c.pattern, c.filter); got != c.want {
			t.Errorf("subsetOf(%q, %q) = %v, want %v", c.pattern, c.filter, got, c.want)
		}
	}
}

func TestSanitize(t *testing.T) {
	e := &event.Event{AggregateType: "a.b*c>d e\tf\x00g-ü", EventType: "x", AggregateID: ""}
	tmpl, err := template.Parse("p.{aggregate_type}.{event_type}.{aggregate_id}", sanitize)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tmpl.Render(e), "p.a_b_c_d_e_f_g-ü"+template.Hash(e.AggregateType)+".x."+template.Hash(""); got != want {
		t.Errorf("Render = %q, want %q", got, want)
	}
}

func TestEnsureStreamCreates(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}", Options{})
	ctx := context.Background()

	err := s.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "OUTBOX does not exist") || !strings.Contains(err.Error(), "relay init") {
		t.Fatalf("Check before EnsureStream = %v, want an error saying the stream is missing", err)
	}
	for range 2 {
		if err := s.EnsureStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after EnsureStream: %v", err)
	}
	cfg := stream(t, s).CachedInfo().Config
	if !slices.Equal(cfg.Subjects, []string{"outbox.*"}) || cfg.Storage != jetstream.FileStorage || cfg.Duplicates != 2*time.Minute {
		t.Errorf("stream config: subjects %v, storage %v, duplicates %v; want [outbox.*], file, 2m", cfg.Subjects, cfg.Storage, cfg.Duplicates)
	}
}

func TestEnsureStreamExisting(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}", Options{})
	ctx := context.Background()
	create := func(subjects ...string) {
		t.Helper()
		_ = s.js.DeleteStream(ctx, "OUTBOX")
		if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUTBOX", Subjects: subjects, Storage: jetstream.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
	}

	create("outbox.>")
	if err := s.EnsureStream(ctx); err != nil {
		t.Errorf("EnsureStream on a stream with outbox.>: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check on a stream with outbox.>: %v", err)
	}

	create("other.*", "outbox.order")
	for name, f := range map[string]func(context.Context) error{"EnsureStream": s.EnsureStream, "Check": s.Check} {
		err := f(ctx)
		if err == nil {
			t.Fatalf("%s on a stream not covering outbox.*: no error", name)
		}
		for _, want := range []string{"OUTBOX", "other.* outbox.order", "outbox.*", "add outbox.* to the stream's subjects"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s error %q does not mention %q", name, err, want)
			}
		}
	}
	if subjects := stream(t, s).CachedInfo().Config.Subjects; len(subjects) != 2 {
		t.Errorf("EnsureStream changed the existing stream's subjects to %v", subjects)
	}
}

func TestPublishOversizedIsPermanent(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{MaxPayload: 64 * 1024})
	s := newStreamSink(t, srv.URL(), Options{})
	batch := testEvents(3, 3)
	batch[1].Payload = bytes.Repeat([]byte("x"), 100*1024)

	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 3), []string{"ok", "permanent", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	if msg := sink.Failed(err, 1).Error(); !strings.Contains(msg, batch[1].ID) || !strings.Contains(msg, "outbox.order") {
		t.Errorf("error %q does not name the event and subject", msg)
	}
	if n := len(storedMsgs(t, s)); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
}

func TestPublishOverStreamMaxMsgSizeIsPermanent(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}", Options{})
	_, err := s.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "OUTBOX", Subjects: []string{"outbox.*"}, MaxMsgSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	batch := testEvents(2, 2)
	batch[0].Payload = bytes.Repeat([]byte("x"), 2048)

	err = s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 2), []string{"permanent", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
}

// TestPublishOverFileStoreLimitIsPermanent: a JetStream file store takes no
// message over 32 MiB, whatever max_payload allows; such an event is its
// own fault, not the stream's (before, it was held as an unreachable
// destination, and the events behind it with it).
func TestPublishOverFileStoreLimitIsPermanent(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{MaxPayload: 64 << 20})
	// A loaded machine takes longer than the default 5 s to move 40 MiB
	// and answer: the test is about the answer's class, not its speed.
	s := newStreamSink(t, srv.URL(), Options{AckTimeout: 2 * time.Minute})
	batch := testEvents(2, 2)
	batch[0].Payload = bytes.Repeat([]byte("x"), 40<<20)

	// A machine loaded enough to take over a minute to write 40 MiB ends
	// the connection (nats.go's flusher timeout): the destination's
	// fault, which the pipeline retries, and so does the test.
	var got []string
	for try := 0; try < 3; try++ {
		err := s.Publish(context.Background(), batch)
		got = sinktest.Classes(err, 2)
		if !slices.Equal(got, []string{"unavailable", "unavailable"}) {
			break
		}
		t.Logf("publish %d: %v; publishing again", try+1, err)
	}
	if want := []string{"permanent", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v", got, want)
	}
}

func TestPublishBadHeaderNameIsPermanent(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	batch := testEvents(2, 2)
	batch[1].Headers = map[string]string{"bad key:": "v"}

	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 2), []string{"ok", "permanent"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
}

// TestPublishWithoutStream: a subject no stream covers (no responders) is a
// failure of the destination, never counted against the event, and Probe
// reports it while the broker itself is fine.
func TestPublishWithoutStream(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newSink(t, srv.URL(), "outbox.{aggregate_type}", Options{})

	batch := testEvents(2, 2)
	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 2), []string{"unavailable", "unavailable"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	dest := s.DestinationOf(batch[0])
	if dest != "outbox.order" {
		t.Errorf("DestinationOf = %q, want outbox.order", dest)
	}
	if err := s.Probe(context.Background(), dest); fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("Probe(%s) = %v, want unavailable", dest, err)
	}
	if err := s.Probe(context.Background(), sink.Broker); err != nil {
		t.Errorf("Probe(broker) = %v", err)
	}
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(context.Background(), dest); err != nil {
		t.Errorf("Probe(%s) with the stream = %v", dest, err)
	}
}

// TestPublishBrokerOutage stops the server while a batch is in flight,
// publishes while it is down, starts it again and republishes everything,
// as the pipeline would.
func TestPublishBrokerOutage(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	all := testEvents(3000, 50)
	if err := s.Publish(context.Background(), all[:100]); err != nil {
		t.Fatal(err)
	}

	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = s.Publish(ctx, all[100:2000])
	}()
	srv.Stop()
	<-done
	checkUnavailable(t, "during the stop", err, 1900)
	t.Logf("during the stop: %v", err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err = s.Publish(ctx, all[2000:])
	if err == nil {
		t.Fatal("publish while the server is down succeeded")
	}
	checkUnavailable(t, "while down", err, 1000)
	t.Logf("while down: %v", err)
	// The publish gives up at its context's 2 s; a loaded machine (load
	// 30) took 3.6 s to get there.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("publish while down took %v", d)
	}

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for pending := all; len(pending) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d events still failing after the restart, last error %v", len(pending), err)
		}
		err = s.Publish(context.Background(), pending)
		t.Logf("after the restart, %d events: %v", len(pending), err)
		var retry []*event.Event
		for i, e := range pending {
			if f := sink.Failed(err, i); f != nil {
				if fault.ClassOf(f) == fault.Permanent {
					t.Fatalf("after the restart: %v", f)
				}
				retry = append(retry, e)
			}
		}
		pending = retry
		time.Sleep(50 * time.Millisecond)
	}

	seen := map[string]int{}
	for _, m := range storedMsgs(t, s) {
		seen[m.Headers().Get("message_id")]++
	}
	for _, e := range all {
		if seen[e.ID] != 1 {
			t.Fatalf("event %s stored %d times, want 1", e.ID, seen[e.ID])
		}
	}
	if len(seen) != len(all) {
		t.Fatalf("stream holds %d distinct events, want %d", len(seen), len(all))
	}
}

// checkUnavailable fails unless every error in err, a Publish result for n
// events, is classified Unavailable.
func checkUnavailable(t *testing.T, when string, err error, n int) {
	t.Helper()
	for i := range n {
		if f := sink.Failed(err, i); f != nil && fault.ClassOf(f) != fault.Unavailable {
			t.Fatalf("%s: event %d failed as %v, want unavailable: %v", when, i, fault.ClassOf(f), f)
		}
	}
}

// newHangingSink returns a sink whose messages reach a plain subscriber that
// never acknowledges them.
func newHangingSink(t *testing.T, opts Options) *Sink {
	t.Helper()
	srv := startServer(t, testenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe("hang.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return newSink(t, srv.URL(), "hang.{aggregate_type}", opts)
}

func TestPublishCancel(t *testing.T) {
	s := newHangingSink(t, Options{AckTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)

	start := time.Now()
	err := s.Publish(ctx, testEvents(10, 10))
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after the cancel", d-200*time.Millisecond)
	}
	if err == nil || !errors.Is(sink.Failed(err, 0), context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	checkUnavailable(t, "after cancel", err, 10)
}

func TestPublishAckTimeout(t *testing.T) {
	s := newHangingSink(t, Options{AckTimeout: 300 * time.Millisecond})
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(3, 3))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Publish took %v with a 300ms ack timeout", d)
	}
	if err == nil || !errors.Is(sink.Failed(err, 2), jetstream.ErrAsyncPublishTimeout) {
		t.Fatalf("err = %v, want an ack timeout", err)
	}
	checkUnavailable(t, "ack timeout", err, 3)
}

// TestWindowFullWaitsOnce fills the window with messages nobody
// acknowledges: the call waits for room once, up to AckTimeout, and fails
// its remaining messages instead of waiting again for each of them.
func TestWindowFullWaitsOnce(t *testing.T) {
	s := newHangingSink(t, Options{MaxInFlight: 2, AckTimeout: 500 * time.Millisecond})
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(20, 20))
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Publish took %v with a full window and a 500ms ack timeout", d)
	}
	if !errors.Is(sink.Failed(err, 19), jetstream.ErrTooManyStalledMsgs) {
		t.Fatalf("err = %v, want the last event failed for the full window", err)
	}
	checkUnavailable(t, "full window", err, 20)
}

// TestCancelWhileWindowFull cancels a call that waits for room in the
// window: it returns at once.
func TestCancelWhileWindowFull(t *testing.T) {
	s := newHangingSink(t, Options{MaxInFlight: 2, AckTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := s.Publish(ctx, testEvents(5, 5))
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Publish returned %v after the cancel", d-200*time.Millisecond)
	}
	if !errors.Is(sink.Failed(err, 4), context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	checkUnavailable(t, "cancel with a full window", err, 5)
}

func TestCloseFailsPendingPublish(t *testing.T) {
	s := newHangingSink(t, Options{AckTimeout: time.Minute})
	time.AfterFunc(200*time.Millisecond, func() { s.Close() })
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(3, 3))
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after Close", d-200*time.Millisecond)
	}
	checkUnavailable(t, "after Close", err, 3)
	if err == nil {
		t.Fatal("Publish succeeded on a closed sink")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestNewUnreachableHidesCredentials(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	url := "nats://alice:s3cret@" + addr + ",nats://t0ken@" + addr
	_, err = New(context.Background(), Config{URL: url, Subject: "outbox.{aggregate_type}", Stream: "OUTBOX"}, Options{})
	if err == nil {
		t.Fatal("New connected to a closed port")
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "t0ken") || strings.Contains(err.Error(), "alice") {
		t.Errorf("error leaks credentials: %v", err)
	}
	if fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("class %v, want unavailable", fault.ClassOf(err))
	}
}

func TestNewBadTemplate(t *testing.T) {
	for _, subject := range []string{"outbox.{nope}", "outbox..{aggregate_type}", "outbox.>", strings.Repeat("s", 1025) + ".{aggregate_type}"} {
		_, err := New(context.Background(), Config{URL: "nats://127.0.0.1:1", Subject: subject, Stream: "OUTBOX"}, Options{})
		if err == nil || !strings.Contains(err.Error(), "sink.nats.subject") {
			t.Errorf("New with subject %q: err = %v, want a sink.nats.subject error", subject, err)
		}
	}
}

// TestWindowRefilledByOwnAcks publishes, as the only caller, more events
// than the window holds: the call reads the acks that free room while it
// waits for it, with no other goroutine reading them.
func TestWindowRefilledByOwnAcks(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{MaxInFlight: 2, AckTimeout: time.Minute})
	if err := s.Publish(context.Background(), testEvents(50, 50)); err != nil {
		t.Fatal(err)
	}
	if n := len(storedMsgs(t, s)); n != 50 {
		t.Fatalf("stream holds %d messages, want 50", n)
	}
}

// TestCallsReused publishes, one call after another on one sink (which
// reuses a call's state for the next): a failed call's errors stay as it
// returned them, and each message carries its own event's headers, none
// of an earlier call's.
func TestCallsReused(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	ctx := context.Background()
	first := testEvents(2, 2)
	first[0].Headers = map[string]string{"tenant": "t1"}
	first[1].Payload = make([]byte, 2<<20) // fails: over max_payload
	failed := s.Publish(ctx, first)
	want := sink.Failed(failed, 1)
	if sink.Failed(failed, 0) != nil || want == nil {
		t.Fatalf("first call: %v", failed)
	}
	wantMsg := want.Error()
	bad := testEvent(9, "order", "y")
	bad.Payload = make([]byte, 2<<20)
	if err := s.Publish(ctx, []*event.Event{bad, testEvent(10, "order", "x")}); sink.Failed(err, 0) == nil || sink.Failed(err, 1) != nil {
		t.Fatalf("second call: %v", err)
	}
	for i, headers := range []map[string]string{{"tenant": "t2"}, {"source": "s"}, {"tenant": "t4"}} {
		e := testEvent(11+i, "order", "x")
		e.Headers = headers
		if err := s.Publish(ctx, []*event.Event{e}); err != nil {
			t.Fatal(err)
		}
	}
	if got := sink.Failed(failed, 1); got == nil || got.Error() != wantMsg || sink.Failed(failed, 0) != nil {
		t.Fatalf("the first call's errors changed: %v", failed)
	}
	msgs := storedMsgs(t, s)
	if len(msgs) != 5 {
		t.Fatalf("stream holds %d messages, want 5", len(msgs))
	}
	for i, want := range []map[string]string{{"tenant": "t1"}, nil, {"tenant": "t2"}, {"source": "s"}, {"tenant": "t4"}} {
		h := msgs[i].Headers()
		id := h.Get("message_id")
		if len(h) != 6+len(want) || h.Get(jetstream.MsgIDHeader) != id || h.Get("aggregate_type") != "order" {
			t.Errorf("message %d (%s): headers %v", i, id, h)
		}
		for k, v := range want {
			if h.Get(k) != v {
				t.Errorf("message %d (%s): %s = %q, want %q", i, id, k, h.Get(k), v)
			}
		}
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// refusingReceiver is a webhook receiver that records the deliveries its
// refusal function accepts and counts the requests it refuses.
type refusingReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	ds       []verify.Delivery
	refusals atomic.Int64
}

// startRefusingReceiver starts a receiver that answers each request as
// refuse says for its aggregate id: status 0 accepts and records the
// delivery; any other status refuses the request, with Retry-After when
// retryAfter is not empty.
func startRefusingReceiver(t *testing.T, refuse func(aggregateID string) (status int, retryAfter string)) *refusingReceiver {
	rc := &refusingReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		agg := r.Header.Get("aggregate_id")
		if code, retryAfter := refuse(agg); code != 0 {
			rc.refusals.Add(1)
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			http.Error(w, "refused", code)
			return
		}
		rc.mu.Lock()
		rc.ds = append(rc.ds, payloadDelivery(r.Header.Get("message_id"), agg, body))
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *refusingReceiver) deliveries() []verify.Delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]verify.Delivery(nil), rc.ds...)
}

// readyzBody returns the status and body of /readyz.
func readyzBody(addr string) (int, string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// deadLetters counts the dead-letter table's rows.
func (s *stack) deadLetters() int {
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dead_letter`).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// refusalWindow is how long TestReceiverRefusesMidStream's receiver refuses
// every request, and how many events it streams; RELAY_REFUSAL_WINDOW (a Go
// duration) and RELAY_REFUSAL_EVENTS change them for a measurement by hand,
// e.g. 60s and 20000.
func refusalWindow(t *testing.T) (time.Duration, int) {
	window, events := 3*time.Second, 4000
	if v := os.Getenv("RELAY_REFUSAL_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RELAY_REFUSAL_WINDOW: %v", err)
		}
		window = d
	}
	if v := os.Getenv("RELAY_REFUSAL_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("RELAY_REFUSAL_EVENTS: %v", err)
		}
		events = n
	}
	return window, events
}

// TestReceiverRefusesMidStream: the webhook receiver answers 401, then 403,
// then 404 to every request for a while in the middle of a stream, with
// retry.max_attempts 1 so that any counted attempt would dead-letter. The
// relay reports not ready naming the URL, dead-letters nothing, and
// delivers everything in order once the receiver accepts again. Both
// capture modes.
func TestReceiverRefusesMidStream(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			receiverRefuses(t, mode)
		})
	}
}

func receiverRefuses(t *testing.T, mode string) {
	window, events := refusalWindow(t)
	var status atomic.Int64 // 0: accept
	rc := startRefusingReceiver(t, func(string) (int, string) { return int(status.Load()), "" })
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: mode, Collect: rc.deliveries,
		Sink:  fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events/{aggregate_type}\n", rc.URL),
		Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n"})
	relay := s.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, events, 200, 4); close(produced) }()
	waitFor(t, func() bool { return len(rc.deliveries()) >= 300 })

	start := time.Now()
	for i, code := range []int{401, 403, 404} {
		status.Store(int64(code))
		if i == 0 {
			waitFor(t, func() bool {
				code, body := readyzBody(addr)
				return code == http.StatusServiceUnavailable && strings.Contains(body, rc.URL+"/events/order") &&
					strings.Contains(scrape(t, addr), `relay_destination_broken_seconds{destination="`+rc.URL+`/events/order"}`)
			})
		}
		time.Sleep(time.Until(start.Add(window * time.Duration(i+1) / 3)))
	}
	during := len(rc.deliveries())
	status.Store(0)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	<-produced
	s.waitDrained(120 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	if n := s.deadLetters(); n != 0 {
		t.Fatalf("%d events dead-lettered while the receiver refused every request", n)
	}
	if n := strings.Count(relay.logs.String(), "destination unreachable"); n != 1 {
		t.Errorf("%d 'destination unreachable' log lines for one outage, want 1", n)
	}
	t.Logf("%s: receiver refused %d requests over %s (401, 403, 404); %d of %d events delivered before it accepted again; dead letters 0; %s",
		mode, rc.refusals.Load(), window, during, events, wire)
}

// TestOneBrokenURLDoesNotStopOthers: with a URL per aggregate (a route the
// rows choose), the receiver answers 404 to the URLs of a few aggregates.
// The other aggregates are all delivered while those are held; the relay
// stays ready (/readyz 200, relay_sink_ready 1) while /status and the
// metrics name the broken URLs; once they are accepted, everything is
// delivered in order and nothing is dead-lettered.
func TestOneBrokenURLDoesNotStopOthers(t *testing.T) {
	t.Parallel()
	broken := map[string]bool{"order-0": true, "order-1": true, "order-2": true}
	var status atomic.Int64
	status.Store(http.StatusNotFound)
	rc := startRefusingReceiver(t, func(agg string) (int, string) {
		if broken[agg] {
			return int(status.Load()), ""
		}
		return 0, ""
	})
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Collect: rc.deliveries,
		Sink:  fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events/{aggregate_id}\n", rc.URL),
		Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n"})
	const events = 1000
	s.produce(context.Background(), events, 40, 4)
	var held int
	s.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE aggregate_id IN ('order-0', 'order-1', 'order-2')`).Scan(&held)
	relay := s.start()
	waitFor(t, func() bool { return len(rc.deliveries()) >= events-held })
	waitFor(t, func() bool {
		m := scrape(t, addr)
		return strings.Contains(m, "\nrelay_destinations_broken 3\n") &&
			strings.Contains(m, `relay_destination_broken_seconds{destination="`+rc.URL+`/events/order-0"}`)
	})
	probes := rc.refusals.Load()
	for i := 0; i < 20 || rc.refusals.Load() < probes+3; i++ { // while the broken URLs are probed
		if code, body := readyzBody(addr); code != http.StatusOK {
			t.Fatalf("readyz %d %q while only row-chosen URLs are broken, want 200", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m := scrape(t, addr); !strings.Contains(m, "\nrelay_sink_ready 1\n") {
		t.Errorf("metrics with three broken URLs:\n%s", relayLines(m))
	}
	if st := get(addr, "/status"); !strings.Contains(st, rc.URL+"/events/order-0") || strings.Contains(st, "order-3") {
		t.Errorf("/status %s, want the broken URLs only", st)
	}
	status.Store(0)
	s.waitDrained(60 * time.Second)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.verify()
	if n := s.deadLetters(); n != 0 {
		t.Fatalf("%d events dead-lettered", n)
	}
	t.Logf("%d events of 3 aggregates held behind their broken URLs while %d others were delivered", held, events-held)
}

// TestIdleReadiness: with an idle outbox, the relay reports not ready when
// the broker dies (JetStream account info fails) and ready again when it is
// back, without publishing anything.
func TestIdleReadiness(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	defer relay.stop(t, 15*time.Second)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.nats.Stop()
	waitFor(t, func() bool {
		code, body := readyzBody(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "(broker)")
	})
	waitMetrics(t, addr, "relay_sink_ready 0", "relay_destinations_broken 1")
	if err := s.nats.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
}

// TestIdleReadinessHealthURL: an idle webhook receiver is checked through
// sink.webhook.health_url.
func TestIdleReadinessHealthURL(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Collect: func() []verify.Delivery { return nil },
		Sink:  fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events\n    health_url: %s/health\n", srv.URL, srv.URL),
		Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	defer relay.stop(t, 15*time.Second)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	healthy.Store(false)
	waitFor(t, func() bool {
		code, body := readyzBody(addr)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "503")
	})
	healthy.Store(true)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
}

// TestKafkaTopicDeniedMidStream: Kafka answers TOPIC_AUTHORIZATION_FAILED to
// every produce for a few seconds in the middle of a stream (an ACL
// removed, then restored), with retry.max_attempts 1. Nothing is
// dead-lettered and everything is delivered in order. Both capture modes.
func TestKafkaTopicDeniedMidStream(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c, sinkYAML, collect := startKafkaCluster(t)
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: mode, Collect: collect, Sink: sinkYAML,
				Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n"})
			relay := s.start()
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() { s.produce(ctx, 2000, 100, 4); close(produced) }()
			waitFor(t, func() bool { return scrapeCounter(addr, "relay_events_published_total") >= 200 })
			h := c.Kfake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.TopicAuthorizationFailed, Count: -1})
			waitFor(t, func() bool {
				code, body := readyzBody(addr)
				return code == http.StatusServiceUnavailable && strings.Contains(body, "outbox.order")
			})
			time.Sleep(3 * time.Second)
			h.Remove()
			<-produced
			s.waitDrained(60 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			if n := s.deadLetters(); n != 0 {
				t.Fatalf("%d events dead-lettered while the topic was denied", n)
			}
			t.Logf("%s: %s", mode, wire)
		})
	}
}

// collectAll collects the messages of the queue at url until the queue
// holds none, and returns how many were collected in all. One collect may
// end early: under load the emulator has answered a ReceiveMessage with no
// message while hundreds were visible (GetQueueAttributes right after: 283
// visible, none in flight or delayed), and the queue's deletion lost them.
func collectAll(t *testing.T, srv *testenv.SQS, url string, collect func() []verify.Delivery) int {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute) // a message received and not deleted is visible again after 60 s
	for {
		n := len(collect())
		c, err := srv.Counts(url)
		switch {
		case err != nil:
			t.Logf("count the queue's messages: %v", err)
		case c.Empty():
			return n
		default:
			t.Logf("after %d messages collected the queue holds %+v: collecting again", n, c)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue still holds messages after %d were collected", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrapeCounter returns the value of an unlabelled metric, or -1 when it
// is missing or the relay does not answer.
func scrapeCounter(addr, name string) float64 {
	for _, line := range strings.Split(get(addr, "/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestNATSStreamDeletedMidStream: the JetStream stream is deleted for a few
// seconds in the middle of a stream, then created again with the same
// config, with retry.max_attempts 1. Publishes meanwhile get no responders
// (nothing subscribes to the subject), a failure of the destination:
// nothing is dead-lettered and everything is delivered in order. Deleting
// drops the stream's messages, so the test first takes the subjects off
// the stream and reads what it holds; deliveries are what the stream held
// then and holds at the end (no core subscriber, which would stand in for
// the missing stream and turn no responders into ack timeouts). Both
// capture modes.
func TestNATSStreamDeletedMidStream(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var s *stack
			var before []verify.Delivery
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s = newStack(t, stackOptions{Mode: mode, Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n",
				Collect: func() []verify.Delivery { return append(slices.Clip(before), streamDeliveries(t, s.nats.URL())...) }})
			relay := s.start()
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() { s.produce(ctx, 2000, 100, 4); close(produced) }()
			waitFor(t, func() bool { return scrapeCounter(addr, "relay_events_published_total") >= 200 })

			nc, err := nats.Connect(s.nats.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			st, err := js.Stream(ctx, "OUTBOX")
			if err != nil {
				t.Fatal(err)
			}
			cfg := st.CachedInfo().Config
			off := cfg
			off.Subjects = []string{"parked.>"}
			if _, err := js.UpdateStream(ctx, off); err != nil {
				t.Fatal(err)
			}
			before = streamDeliveries(t, s.nats.URL())
			if err := js.DeleteStream(ctx, "OUTBOX"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool {
				code, body := readyzBody(addr)
				return code == http.StatusServiceUnavailable && strings.Contains(body, "outbox.order")
			})
			time.Sleep(3 * time.Second)
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			<-produced
			s.waitDrained(60 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			if n := s.deadLetters(); n != 0 {
				t.Fatalf("%d events dead-lettered while the stream was missing", n)
			}
			t.Logf("%s: %d events stored before the stream was deleted; %s", mode, len(before), wire)
		})
	}
}

// TestSQSQueueDeletedMidStream: the FIFO queue is deleted for a few seconds
// in the middle of a stream, then created again with the same name and
// attributes, with retry.max_attempts 1. Sends meanwhile get
// QueueDoesNotExist, a failure of the destination: nothing is dead-lettered
// and everything is delivered in order to the new queue. Deleting drops the
// queue's messages, so the test first stalls the relay's connection (a
// proxy), receives what the queue holds until it is empty, deletes it, and
// cuts the stalled connections so that no send answered after that counts.
// Both capture modes.
func TestSQSQueueDeletedMidStream(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv, url, collect := startSQSQueue(t)
			proxy, err := testenv.StartProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: mode, Collect: collect, Sink: sqsSink("http://" + proxy.Addr()),
				Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n"})
			relay := s.start()
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() { s.produce(ctx, 2000, 100, 4); close(produced) }()
			waitFor(t, func() bool { return scrapeCounter(addr, "relay_events_published_total") >= 200 })

			proxy.Stall()
			before := collectAll(t, srv, url, collect)
			if err := srv.DeleteQueue(url); err != nil {
				t.Fatal(err)
			}
			proxy.Cut()
			proxy.Resume()
			waitFor(t, func() bool {
				code, body := readyzBody(addr)
				return code == http.StatusServiceUnavailable && strings.Contains(body, sqsQueue)
			})
			time.Sleep(3 * time.Second)
			if again, err := srv.CreateQueue(sqsQueue, map[string]string{"FifoQueue": "true"}); err != nil || again != url {
				t.Fatalf("create the queue again: %q, %v; want %s", again, err, url)
			}
			<-produced
			s.waitDrained(3 * time.Minute) // the SQS emulator and its consumer are slow on a loaded machine
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			if n := s.deadLetters(); n != 0 {
				t.Fatalf("%d events dead-lettered while the queue was missing", n)
			}
			t.Logf("%s: %d events received before the queue was deleted; %s", mode, before, wire)
		})
	}
}

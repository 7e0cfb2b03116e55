package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/verify"
)

// TestRateLimit drains a 3,000-event backlog into a webhook receiver with
// sink.rate_limit at 200 events/s and a burst of 20. The receiver sees at
// most ~200/s; the backlog age metric grows while the limit holds; the wait
// shows in relay_rate_limit_wait_seconds_total; a SIGTERM in the middle
// drains only the pipeline's small window (one capture batch of 500 here,
// plus the next) well within shutdown_timeout, leaving no delivered row
// unarchived; a second run delivers the rest, and every aggregate keeps its
// order.
func TestRateLimit(t *testing.T) {
	const events, limit, burst = 3000, 200, 20
	var mu sync.Mutex
	var ds []verify.Delivery
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		ds = append(ds, payloadDelivery(r.Header.Get("message_id"), r.Header.Get("aggregate_id"), body))
		at = append(at, time.Now())
	}))
	t.Cleanup(srv.Close)
	collect := func() []verify.Delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]verify.Delivery(nil), ds...)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Collect: collect,
		Sink: fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events\n  rate_limit:\n    events_per_second: %d\n    burst: %d\n",
			srv.URL, limit, burst),
		Extra: "http:\n  listen: " + addr + "\n"})
	s.produce(context.Background(), events, 100, 4)
	relay := s.start()

	// The backlog age is sampled every 5s, the first time at start-up. At
	// 200/s the drain would last 15s, so the second sample comes while rows
	// are left, and shows the age grown by the time in between.
	const age = "relay_oldest_unpublished_age_seconds"
	waitFor(t, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	var first float64
	waitFor(t, func() bool { first = scrapeCounter(addr, age); return first > 0 })
	var second float64
	waitFor(t, func() bool { second = scrapeCounter(addr, age); return second != first })
	left := s.outboxRows()
	t.Logf("backlog age %.1fs, then %.1fs with %d rows left", first, second, left)
	if second < first+3 || left == 0 {
		t.Errorf("backlog age went from %.1fs to %.1fs with %d rows left: the limit did not hold the backlog back", first, second, left)
	}
	if waited := scrapeCounter(addr, "relay_rate_limit_wait_seconds_total"); waited <= 0 {
		t.Errorf("relay_rate_limit_wait_seconds_total = %v, want > 0", waited)
	}

	// Stop in the middle: the drain publishes what the pipeline holds, at
	// the limit, and archives it; the harness's shutdown_timeout is 10s.
	stopped := time.Now()
	if code := relay.stop(t, 8*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	delivered := len(collect())
	if left := s.outboxRows(); left != events-delivered {
		t.Errorf("after the stop: %d rows left with %d of %d delivered; every delivered row should be archived", left, delivered, events)
	}
	mu.Lock()
	span := at[len(at)-1].Sub(at[0])
	rate := float64(len(at)-burst) / span.Seconds()
	mu.Unlock()
	t.Logf("first run: %d requests in %s after the first: %.1f events/s (limit %d, burst %d); stopped in %s",
		delivered, span.Round(time.Millisecond), rate, limit, burst, time.Since(stopped).Round(time.Millisecond))
	if rate > limit*1.15 {
		t.Errorf("received %.1f events/s, more than 15%% over the limit of %d/s", rate, limit)
	}
	if rate < limit*0.75 {
		t.Errorf("received %.1f events/s, far below the limit of %d/s", rate, limit)
	}

	relay = s.start()
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	t.Logf("%s", wire)
	if wire.Duplicates > 0 {
		t.Errorf("%d duplicates: the stop left published rows unarchived", wire.Duplicates)
	}
}

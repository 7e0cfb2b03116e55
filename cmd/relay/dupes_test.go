package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/verify"
)

// drainBatch is capture.poll.batch_size in TestKillDuringDrain.
const drainBatch = 100

// drainWindow is the in-flight window of TestKillDuringDrain's relay: a
// wal source hands out at most 24 batches that are not archived yet, and a
// kill -9 resends at most those of them that reached the broker. (The poll
// pipeline's own bound is higher, 10,000 events, but it holds far fewer
// published and unarchived events at once.)
const drainWindow = 24 * drainBatch

// killAfter is how many events a relay of TestKillDuringDrain has had
// acknowledged when it is killed, of a backlog of at least 4,000.
const killAfter = 600

// TestKillDuringDrain writes a backlog while no relay runs (an outage),
// starts the relay and kills it with -9 while it publishes the backlog, a
// few times, then lets a last relay finish, on every sink and in both
// capture modes: nothing is lost or out of order, and each kill resends at
// most one in-flight window (drainWindow). Before wal replay dropped the
// events an earlier run had archived, a wal relay resent everything
// archived since the slot's confirmed position. A relay is killed once the
// broker acknowledged killAfter of its events (its own counter: the
// consumers lag behind, the SQS one by seconds), and at least one kill
// must leave rows of the backlog in the outbox. SQS FIFO drops a copy
// while the queue still holds the original; the test's consumer deletes
// what it receives, so its copies count as on the other sinks.
// RELAY_TEST_KILLS sets the number of kills (default 3).
func TestKillDuringDrain(t *testing.T) {
	t.Parallel()
	kills := 3
	if v := os.Getenv("RELAY_TEST_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("RELAY_TEST_KILLS: %v", err)
		}
		kills = n
	}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (string, func() []verify.Delivery)
	}{
		{"nats", nil},
		{"kafka", startKafka},
		{"sqs", startSQS},
		{"webhook", startWebhook},
	} {
		for _, mode := range []string{"poll", "wal"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				opts := stackOptions{Mode: mode}
				if tc.start != nil {
					opts.Sink, opts.Collect = tc.start(t)
				}
				killDuringDrain(t, opts, kills)
			})
		}
	}
}

// killDuringDrain runs TestKillDuringDrain on one stack.
func killDuringDrain(t *testing.T, opts stackOptions, kills int) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	opts.Extra += "http:\n  listen: " + addr + "\n"
	s := newStack(t, opts)
	rewriteDSN(t, s.cfgPath, "interval: 50ms", fmt.Sprintf("interval: 50ms\n    batch_size: %d", drainBatch))
	ctx := context.Background()
	left := make([]int, kills) // the backlog's rows left in the outbox by each kill
	for i := range kills {
		s.produce(ctx, 4000, 400, 4)
		relay := s.start()
		waitFor(t, func() bool {
			return readyz(addr) != 0 && scrapeCounter(addr, "relay_events_published_total") >= killAfter
		})
		relay.kill()
		left[i] = s.outboxRows()
		s.syncWire() // receive now what the final wait would otherwise receive all at once
	}
	if kills > 0 && slices.Max(left) == 0 {
		t.Errorf("every kill came after the relay had archived the whole backlog (rows left %v): no kill hit a drain", left)
	}
	relay := s.start()
	// The previous relays may have published everything already: the
	// last one must be up before it is stopped.
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(5 * time.Minute) // the SQS emulator and its consumer are slow on a loaded machine
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	perKill := float64(wire.Duplicates) / float64(kills)
	t.Logf("kill -9 during the backlog drain, %d times (%s), rows left by the kills %v: %s; %.1f duplicates per kill (window %d)",
		kills, opts.Mode, left, wire, perKill, drainWindow)
	if perKill > drainWindow {
		t.Errorf("%.1f duplicates per kill, more than the in-flight window of %d events", perKill, drainWindow)
	}
}

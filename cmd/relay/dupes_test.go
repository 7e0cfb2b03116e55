package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
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

// TestKillDuringDrain writes a backlog while no relay runs (an outage),
// starts the relay and kills it with -9 while it publishes the backlog, a
// few times, then lets a last relay finish, on every sink and in both
// capture modes: nothing is lost or out of order, and each kill resends at
// most one in-flight window (drainWindow). Before wal replay dropped the
// events an earlier run had archived, a wal relay resent everything
// archived since the slot's confirmed position. SQS FIFO drops the copies
// within five minutes, so its consumer sees none. RELAY_TEST_KILLS sets
// the number of kills (default 3).
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
	for range kills {
		s.produce(ctx, 4000, 400, 4)
		relay := s.start()
		before := s.delivered()
		waitFor(t, func() bool { return s.delivered() >= before+600 })
		relay.kill()
	}
	relay := s.start()
	// The previous relays may have published everything already: the
	// last one must be up before it is stopped.
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(120 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	perKill := float64(wire.Duplicates) / float64(kills)
	t.Logf("kill -9 during the backlog drain, %d times (%s): %s; %.1f duplicates per kill (window %d)",
		kills, opts.Mode, wire, perKill, drainWindow)
	if perKill > drainWindow {
		t.Errorf("%.1f duplicates per kill, more than the in-flight window of %d events", perKill, drainWindow)
	}
}

// delivered returns how many deliveries the stack's consumer has seen.
func (s *stack) delivered() int {
	s.syncWire()
	return s.wire.Deliveries()
}

package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestCluster publishes through a Redis Cluster client to a one-node
// cluster that holds every slot: the streams are written, each in order.
func TestCluster(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{Cluster: true})
	admin(t, srv, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
	c := newClient(t, srv.URL())
	defer c.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(c.ClusterInfo(ctx).Val(), "cluster_state:ok"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("cluster not ok within 30s")
		}
	}
	s := newTestSink(t, Config{URL: srv.URL(), ClusterAddrs: []string{srv.Addr()}, Stream: "cl.{aggregate_type}"}, Options{})
	publishSteps(t, s)
	checkSteps(t, srv.URL(), "cl.")
}

// TestSentinel publishes through a Sentinel that monitors the master: the
// sink asks it for the master's address.
func TestSentinel(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedis(t, testenv.RedisOptions{})
	sentinel := testenv.StartRedis(t, testenv.RedisOptions{SentinelOf: master.Addr()})
	s := newTestSink(t, Config{URL: "redis://ignored:1/0", Stream: "se.{aggregate_type}",
		Sentinel: Sentinel{Master: "mymaster", Addrs: []string{sentinel.Addr()}}}, Options{})
	publishSteps(t, s)
	checkSteps(t, master.URL(), "se.")
}

// publishSteps publishes 10 steps of each of the aggregate types a and b
// with s, one event per type per call.
func publishSteps(t *testing.T, s *Sink) {
	t.Helper()
	for i := range 10 {
		a, b := testEvent("a", i), testEvent("b", i)
		b.ID = strings.Replace(b.ID, "0000-0000-0000", "0000-0000-0001", 1)
		if err := s.Publish(context.Background(), []*event.Event{a, b}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkSteps checks that the streams prefix+"a" and prefix+"b" at url hold
// the 10 steps in order.
func checkSteps(t *testing.T, url, prefix string) {
	t.Helper()
	msgs := readStreams(t, url, prefix+"*")
	if len(msgs) != 20 {
		t.Fatalf("%d entries, want 20", len(msgs))
	}
	for i, m := range msgs {
		if want := len(testEvent("", i%10).Payload); len(m.Payload) != want {
			t.Fatalf("entry %d of %s: payload of %d bytes, want %d", i, m.Destination, len(m.Payload), want)
		}
	}
}

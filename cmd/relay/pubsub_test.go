package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// pubsubFake is the Pub/Sub fake every relay of the package reaches
// through PUBSUB_EMULATOR_HOST, which parallel tests cannot set each for
// themselves; each test uses a project of its own (newPubSubProject).
var (
	pubsubFake     *pstest.Server
	pubsubProjects atomic.Int64
)

// startPubSubFake starts pubsubFake and points PUBSUB_EMULATOR_HOST at it.
// TestMain calls it before any test runs.
func startPubSubFake() {
	pubsubFake = pstest.NewServer()
	os.Setenv("PUBSUB_EMULATOR_HOST", pubsubFake.Addr)
}

// startPubSub returns the config's sink block for a fixed topic in a
// project of the test's own, which relay init creates, and a collector of
// the topic's messages in the order the fake received them.
func startPubSub(t *testing.T) (string, func() []verify.Delivery) {
	project := fmt.Sprintf("relay-e2e-%d", pubsubProjects.Add(1))
	return pubsubSink(project, ""), pubsubCollector(pubsubFake, project)
}

// pubsubSink returns the sink block for topic outbox-events of project,
// reached through endpoint when it is not empty.
func pubsubSink(project, endpoint string) string {
	y := fmt.Sprintf("sink:\n  type: pubsub\n  pubsub:\n    project_id: %s\n    topic: outbox-events\n", project)
	if endpoint != "" {
		y += "    endpoint: " + endpoint + "\n"
	}
	return y
}

// pubsubCollector returns the deliveries of srv's topics of project, in
// the order srv received them, checking each ordering key.
func pubsubCollector(srv *pstest.Server, project string) func() []verify.Delivery {
	return func() []verify.Delivery {
		var ds []verify.Delivery
		for _, m := range srv.Messages() {
			if !strings.HasPrefix(m.Topic, "projects/"+project+"/") {
				continue
			}
			d := payloadDelivery(m.Attributes["message_id"], m.Attributes["aggregate_id"], m.Data)
			if m.OrderingKey != d.AggregateID {
				d.Problem = "ordering key " + m.OrderingKey + " is not the aggregate_id"
			}
			ds = append(ds, d)
		}
		return ds
	}
}

// TestPubSubOutage takes a Pub/Sub fake of the test's own away for a few
// seconds while producers write: its proxy refuses connections (the
// package's shared fake cannot be stopped), and sink.pubsub.endpoint,
// which wins over PUBSUB_EMULATOR_HOST's address, points relay init and
// relay run at the proxy. While it is down the relay is not ready,
// dead-letters nothing (retry.max_attempts is 1) and no outbox row
// leaves; when it is back the relay drains by itself with no loss and
// per-aggregate order.
func TestPubSubOutage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pubsubOutage(t, mode, 4*time.Second)
		})
	}
}

func pubsubOutage(t *testing.T, mode string, outage time.Duration) {
	fake := pstest.NewServer()
	t.Cleanup(func() { fake.Close() })
	proxy, err := testenv.StartProxy(fake.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	project := fmt.Sprintf("relay-outage-%d", pubsubProjects.Add(1))
	s := newStack(t, stackOptions{Mode: mode, Sink: pubsubSink(project, proxy.Addr()), Collect: pubsubCollector(fake, project),
		Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n  max: 1s\n"})
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 3000, 300, 4); close(produced) }()
	s.waitPublishing()
	proxy.Down()
	stopped := time.Now()
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	// Archives of batches acknowledged before the cut may still finish.
	time.Sleep(500 * time.Millisecond)
	during := s.outboxRows()
	time.Sleep(time.Until(stopped.Add(outage)))
	if n := s.outboxRows(); n < during {
		t.Fatalf("%d outbox rows left the table while Pub/Sub was down (%d → %d)", during-n, during, n)
	}
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	before := s.outboxRows()
	waitFor(t, func() bool { return s.outboxRows() < before })
	resumed := time.Since(back)
	<-produced
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	var dead int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letter`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Fatalf("%d events dead-lettered during a Pub/Sub outage", dead)
	}
	t.Logf("pubsub outage (%s, %s): publishing resumed %.2fs after the proxy came back; %s", mode, outage, resumed.Seconds(), wire)
}

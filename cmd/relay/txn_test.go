package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// readCommitted returns the deliveries a read_committed consumer of c's
// outbox topics sees, for stackOptions.Collect.
func readCommitted(c *kafkatest.Cluster) func() []verify.Delivery {
	return func() []verify.Delivery {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		recs, err := kafkatest.ReadCommitted(ctx, c.Addrs(), "outbox.")
		if err != nil {
			return nil
		}
		ds := make([]verify.Delivery, 0, len(recs))
		for _, r := range recs {
			id, _ := r.Header("message_id")
			agg, _ := r.Header("aggregate_id")
			ds = append(ds, payloadDelivery(id, agg, r.Value))
		}
		return ds
	}
}

// TestKafkaTransactionalKillLoop runs a relay with sink.kafka.transactional
// against kfake, eight times: a backlog is written, the relay started and
// killed with -9 at a random moment while it publishes it; then a last
// relay finishes, in both capture modes. A read_committed consumer sees
// every event exactly once, in per-aggregate order. RELAY_TEST_NO_TXN=1
// runs the same without transactions, to see the duplicates they prevent
// (the test then fails).
func TestKafkaTransactionalKillLoop(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c, yaml, _ := startKafkaCluster(t)
			txn := os.Getenv("RELAY_TEST_NO_TXN") == ""
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: mode, Sink: fmt.Sprintf("%s    transactional: %v\n", yaml, txn), Collect: readCommitted(c),
				Extra: "http:\n  listen: " + addr + "\n"})
			ctx := context.Background()
			kills := 8
			for range kills {
				s.produce(ctx, 1500, 300, 4) // a backlog, drained while the relay is killed
				relay := s.start()
				time.Sleep(time.Duration(200+rand.IntN(1000)) * time.Millisecond) // a random moment, not an assertion
				relay.kill()
			}
			relay := s.start()
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK }) // up before it is stopped
			s.waitDrained(120 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			t.Logf("transactional kafka, kill -9 %d times (%s): read_committed consumer: %s", kills, mode, wire)
			if wire.Duplicates != 0 {
				t.Errorf("a read_committed consumer saw %d duplicates", wire.Duplicates)
			}
		})
	}
}

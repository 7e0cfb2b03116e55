package main

import (
	"context"
	"testing"
	"time"
)

// TestHotAggregateKafka drains a backlog of one aggregate into Kafka,
// which the relay pipelines (several of the aggregate's events in flight),
// with a kill -9 at its first delivery, in both capture modes: no loss,
// message_id on every copy, first deliveries in order.
func TestHotAggregateKafka(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			_, yaml, collect := startKafkaCluster(t)
			s := newStack(t, stackOptions{Mode: mode, Sink: yaml, Collect: collect})
			ctx := context.Background()
			s.produce(ctx, 4000, 1, 1)
			relay := s.start()
			s.waitPublishing()
			relay.kill()
			s.produce(ctx, 1500, 1, 1)
			start := time.Now()
			relay = s.start()
			s.waitDrained(60 * time.Second)
			t.Logf("%s: drained the rest in %v", mode, time.Since(start).Round(time.Millisecond))
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			t.Logf("%s: %s", mode, wire)
		})
	}
}

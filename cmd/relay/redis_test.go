package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// startRedis starts a redis-server that keeps its entries across a stop
// (append-only file) and returns it, the config's sink block for it and a
// collector reading every entry of the outbox.* streams.
func startRedis(t *testing.T) (*testenv.Redis, string, func() []verify.Delivery) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Persist: true})
	collect := func() []verify.Delivery {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: -1})
		defer c.Close()
		var ds []verify.Delivery
		iter := c.ScanType(ctx, 0, "outbox.*", 1000, "stream").Iterator()
		for iter.Next(ctx) {
			entries, err := c.XRange(ctx, iter.Val(), "-", "+").Result()
			if err != nil {
				t.Logf("XRANGE %s: %v", iter.Val(), err)
				return ds
			}
			for _, e := range entries {
				id, _ := e.Values["message_id"].(string)
				agg, _ := e.Values["aggregate_id"].(string)
				payload, _ := e.Values["payload"].(string)
				ds = append(ds, payloadDelivery(id, agg, []byte(payload)))
			}
		}
		if err := iter.Err(); err != nil {
			t.Logf("SCAN: %v", err)
		}
		return ds
	}
	return srv, fmt.Sprintf("sink:\n  type: redis\n  redis:\n    url: %s\n", srv.URL()), collect
}

// startRedisSink adapts startRedis to TestEverySink.
func startRedisSink(t *testing.T) (string, func() []verify.Delivery) {
	_, sinkYAML, collect := startRedis(t)
	return sinkYAML, collect
}

// TestRedisOutage stops redis-server for a few seconds while producers
// write: the relay reports not ready, dead-letters nothing, and once the
// server is back drains by itself, losing nothing and keeping each
// aggregate's order.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv, sinkYAML, collect := startRedis(t)
	s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect})
	addr := s.withHTTP()
	rewriteDSN(t, s.cfgPath, "max: 1s", "max: 1s\n  max_attempts: 1") // a failure counted as the events' would dead-letter them
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 2000, 200, 4); close(produced) }()
	s.waitPublishing()
	srv.Stop()
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	time.Sleep(500 * time.Millisecond) // archives of acknowledged batches may still finish
	during := s.outboxRows()
	time.Sleep(3 * time.Second)
	if n := s.outboxRows(); n < during {
		t.Fatalf("%d outbox rows left the table while Redis was down", during-n)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	<-produced
	s.finish(relay, addr)
	var dead int
	s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letter`).Scan(&dead)
	if dead != 0 {
		t.Fatalf("%d events dead-lettered during a Redis outage", dead)
	}
}

// TestRedisStart checks how relay run starts against Redis: refused
// credentials end it with exit status 1 without printing the password; a
// server that is down makes it wait, not ready, and it publishes once the
// server is up.
func TestRedisStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"--requirepass", "right-pw"}})
	dsn := testenv.NewDB(t)
	cfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: redis\n  redis:\n    url: redis://:wr0ng-pw@%s/0\n", dsn, srv.Addr()))
	out, code := runRelay(t, "run", "--config", cfg)
	if code != 1 || !strings.Contains(out, "WRONGPASS") || strings.Contains(out, "wr0ng") {
		t.Errorf("wrong password: exit %d, want 1 with WRONGPASS:\n%s", code, out)
	}

	down, sinkYAML, collect := startRedis(t)
	s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect}) // relay init needs the server
	addr := s.withHTTP()
	down.Stop()
	relay := s.start()
	s.writeSome(20)
	waitStartRetries(t, relay, addr, "relay_sink_ready 0")
	if err := down.Start(); err != nil {
		t.Fatal(err)
	}
	s.finish(relay, addr)
}

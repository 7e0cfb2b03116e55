package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestPostgresFailover runs the relay, in both capture modes, against a
// primary and its synchronous standby named together in a multi-host URL
// with target_session_attrs=read-write. Mid-stream the primary is killed
// (pg_ctl stop -m immediate) and the standby promoted; producers reconnect
// and go on. Every event whose commit the old or new primary acknowledged
// is delivered, per-aggregate order holds, and in wal mode the slot missing
// on the new primary is recreated, logged and counted as a failover.
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			failover(t, mode)
		})
	}
}

func failover(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	if _, err := primary.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	standby, err := primary.StartStandby(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/app?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: mode, DSN: dsn, Extra: "http:\n  listen: " + addr + "\nretry:\n  max: 1s\n"})
	relay := s.start()
	marker := s.watchAggregate(markerAggregate)

	produced := make(chan struct{})
	go func() { s.produce(ctx, 4000, 400, 4); close(produced) }()
	waitFor(t, func() bool { return s.wire.Check().Distinct >= 800 })
	promoted, resumed := s.failOver(ctx, primary, standby, marker)
	<-produced
	s.waitDrained(60 * time.Second)
	if mode == "wal" {
		waitMetrics(t, addr, `relay_replication_slot_recreated_total{reason="failover"} 1`)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, stream := s.verify()
	logs := relay.logs.String()
	failovers := strings.Count(logs, "replication slot missing on the new primary: failover")
	if mode == "wal" && failovers != 1 {
		t.Errorf("the relay logged %d failovers, want 1", failovers)
	}
	t.Logf("failover (%s): %d events written, %d lost, %d duplicates on the wire, %d order breaks; stream %s; promoted %.2fs and publishing resumed %.2fs after the kill; failover logged %d times",
		mode, wire.Written, len(wire.Missing), wire.Duplicates, len(wire.OrderBreaks), stream, promoted.Seconds(), resumed.Seconds(), failovers)
}

// markerAggregate is the aggregate of the event written once the standby
// is promoted; producers use aggregates below it.
const markerAggregate = 1 << 20

// failOver kills primary, promotes standby and waits until an event written
// to the new primary is delivered (marker, from watchAggregate). It returns
// how long after the kill the promotion ended and publishing resumed.
func (s *stack) failOver(ctx context.Context, primary, standby *testenv.Postgres, marker <-chan struct{}) (promoted, resumed time.Duration) {
	t := s.t
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted = time.Since(killed)
	for {
		if _, err := s.write(ctx, markerAggregate, 1); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-marker:
	case <-time.After(60 * time.Second):
		t.Fatal("no event written on the new primary was delivered within 60s")
	}
	return promoted, time.Since(killed)
}

// watchAggregate returns a channel closed once an event of aggregate agg
// is published.
func (s *stack) watchAggregate(agg int) <-chan struct{} {
	nc, err := nats.Connect(s.nats.URL())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	seen := make(chan struct{})
	name := fmt.Sprintf("order-%d", agg)
	var closed bool
	if _, err := nc.Subscribe("outbox.>", func(m *nats.Msg) {
		if !closed && m.Header.Get("aggregate_id") == name {
			closed = true
			close(seen)
		}
	}); err != nil {
		s.t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		s.t.Fatal(err)
	}
	return seen
}

// scrape returns the relay's /metrics.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

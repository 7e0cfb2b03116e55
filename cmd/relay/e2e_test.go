package main

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestEndToEnd runs concurrent producers over 600 aggregates against a
// running relay and checks every guarantee on the wire and in the stream.
func TestEndToEnd(t *testing.T) {
	s := newStack(t)
	relay := s.start()
	begin := time.Now()
	s.produce(context.Background(), 12000, 600, 8)
	s.waitDrained(60 * time.Second)
	elapsed := time.Since(begin)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0", code)
	}
	wire, stream := s.verify()
	t.Logf("end to end: %s in %.1fs; stream: %s", wire, elapsed.Seconds(), stream)
}

// TestKillAndRestart kills the relay with SIGKILL at random moments while
// producers write, restarts it each time, and checks that nothing is lost,
// every copy carries its row's message_id and per-aggregate order holds.
func TestKillAndRestart(t *testing.T) {
	s := newStack(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 12000, 600, 8); close(produced) }()
	kills := 0
	for done := false; !done; {
		relay := s.start()
		select {
		case <-produced:
			done = true
		case <-time.After(time.Duration(200+rand.IntN(600)) * time.Millisecond):
		}
		if !done || kills < 3 {
			relay.kill()
			kills++
		}
	}
	s.start()
	s.waitDrained(60 * time.Second)
	wire, stream := s.verify()
	t.Logf("kill -9 %d times: %s; stream: %s", kills, wire, stream)
}

// TestGracefulStop stops the relay with SIGTERM mid-stream: it exits 0,
// and a restarted relay finishes the work.
func TestGracefulStop(t *testing.T) {
	s := newStack(t)
	relay := s.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 6000, 500, 4); close(produced) }()
	time.Sleep(500 * time.Millisecond)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0:\n%s", code, relay.logs.String())
	}
	<-produced
	s.start()
	s.waitDrained(60 * time.Second)
	wire, _ := s.verify()
	t.Logf("graceful stop: %s", wire)
}

// TestPoisonRowDeadLettered puts a malformed row among good ones of the same
// aggregate: it goes to the dead-letter table with its error, and the rest
// are published in order.
func TestPoisonRowDeadLettered(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	s.produce(ctx, 20, 4, 2)
	poison := uuid.NewString()
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, 'order', 'order-0', 'step', '{}', '{"attempt": 1}')`, poison); err != nil {
		t.Fatal(err)
	}
	s.produce(ctx, 20, 4, 2)
	relay := s.start()
	s.waitDrained(30 * time.Second)
	relay.stop(t, 15*time.Second)
	s.verify()
	var id, msg, class string
	if err := s.pool.QueryRow(ctx, `SELECT id::text, error, error_class FROM outbox_dead_letter`).Scan(&id, &msg, &class); err != nil {
		t.Fatal(err)
	}
	if id != poison || class != "permanent" || !strings.Contains(msg, "headers") {
		t.Fatalf("dead letter %s %q %s", id, msg, class)
	}
}

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestTableFree runs the table-free outbox (capture.wal.source messages)
// as a role with only the grants `relay init --dry-run --role` prints (the
// replication privilege and the dead-letter table, no outbox table):
// kill -9 at random moments while producers emit messages loses none,
// and every copy carries its message's id in per-aggregate order; a
// broker outage dead-letters nothing and publishing resumes after it; a
// malformed message is dead-lettered with its raw content while the
// events after it are published.
func TestTableFree(t *testing.T) {
	t.Parallel()
	t.Run("kill", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, stackOptions{Messages: true, LeastPrivilege: true})
		s.noOutboxTable()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		produced := make(chan struct{})
		go func() { s.produce(ctx, 6000, 200, 4); close(produced) }()
		kills := 0
		for done := false; !done || kills < 5; {
			before := s.wire.Deliveries()
			relay := s.start()
			// Kill it while it publishes: once it delivered something
			// more, at a random moment of the next 300 ms.
			waitFor(t, func() bool {
				return s.wire.Deliveries() > before || isClosed(produced) && s.wire.Check().Missing == nil
			})
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
			done = isClosed(produced)
			relay.kill()
			kills++
		}
		if _, err := s.pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outbox', '{"id": "not a uuid"}')`); err != nil {
			t.Fatal(err)
		}
		s.produce(ctx, 20, 4, 1)
		s.start()
		s.waitDrained(60 * time.Second)
		wire, stream := s.verify()
		// The malformed message is dead-lettered when its batch is
		// settled, which may follow the last delivery.
		waitFor(t, func() bool { return s.deadLetters() > 0 })
		var raw, reason string
		err := s.pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8'), error FROM outbox_dead_letter`).Scan(&raw, &reason)
		if err != nil || raw != `{"id": "not a uuid"}` || !strings.Contains(reason, "aggregate_type is missing") {
			t.Fatalf("dead letter %q (%q), %v: want the malformed message with its reason", raw, reason, err)
		}
		t.Logf("table-free, kill -9 %d times: %s; stream: %s", kills, wire, stream)
	})
	t.Run("outage", func(t *testing.T) {
		t.Parallel()
		s := newStack(t, stackOptions{Messages: true, LeastPrivilege: true, Extra: "retry:\n  max_attempts: 1\n"})
		s.wireGaps = true
		relay := s.start()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		produced := make(chan struct{})
		go func() { s.produce(ctx, 3000, 200, 4); close(produced) }()
		s.waitPublishing()
		s.nats.Stop()
		time.Sleep(4 * time.Second)
		if err := s.nats.Start(); err != nil {
			t.Fatal(err)
		}
		<-produced
		s.waitDrained(60 * time.Second)
		if code := relay.stop(t, 15*time.Second); code != 0 {
			t.Fatalf("exit %d", code)
		}
		s.verify()
		var dead int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letter`).Scan(&dead); err != nil || dead != 0 {
			t.Fatalf("%d events dead-lettered during a broker outage (%v)", dead, err)
		}
	})
}

// isClosed reports whether c is closed.
func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// noOutboxTable fails the test when the stack's database has an outbox
// table: the table-free outbox must not need one.
func (s *stack) noOutboxTable() {
	s.t.Helper()
	var exists bool
	if err := s.pool.QueryRow(context.Background(), `SELECT to_regclass('outbox') IS NOT NULL`).Scan(&exists); err != nil || exists {
		s.t.Fatalf("outbox table exists: %v, %v", exists, err)
	}
}

// TestTableFreeRefusesPostgres13: PostgreSQL 13's pgoutput sends no
// logical decoding messages, so `relay check` fails naming the version
// and `relay init` and `relay run` exit 1 saying why.
func TestTableFreeRefusesPostgres13(t *testing.T) {
	t.Parallel()
	bin, err := testenv.PostgresBin(13)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Bin: bin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dsn, err := pg.CreateDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	cfg := writeConfig(t, "postgres:\n  url: "+dsn+"\ncapture:\n  mode: wal\n  wal:\n    source: messages\nsink:\n  type: nats\n  nats:\n    url: "+n.URL()+"\n")
	want := "capture.wal.source: messages needs PostgreSQL 14 or later"
	for _, cmd := range []string{"init", "run"} {
		if out, code := runRelay(t, cmd, "--config", cfg); code != 1 || !strings.Contains(out, want) {
			t.Errorf("relay %s: exit %d, want 1 saying %q:\n%s", cmd, code, want, out)
		}
	}
	if out, _ := runRelay(t, "check", "--config", cfg); !strings.Contains(out, "FAIL  capture.wal.source messages: PostgreSQL 14 or later") {
		t.Errorf("relay check does not fail on the version:\n%s", out)
	}
}

// TestTableFreeHeldRoute: with the table-free outbox a broken destination
// (one aggregate's webhook URL answering 503) holds its events in memory,
// not in a table; the other URLs receive everything, the held events are
// dead-lettered once sink.held_max_age passes, and the slot is then
// confirmed past every message.
func TestTableFreeHeldRoute(t *testing.T) {
	t.Parallel()
	rc := startRefusingReceiver(t, func(agg string) (int, string) {
		if agg == "order-0" {
			return http.StatusServiceUnavailable, ""
		}
		return 0, ""
	})
	s := newStack(t, stackOptions{Messages: true, Collect: rc.deliveries, Extra: "retry:\n  initial: 50ms\n  max: 200ms\n",
		Sink: fmt.Sprintf("sink:\n  type: webhook\n  held_max_age: 3s\n  webhook:\n    url: %s/events/{aggregate_id}\n", rc.URL)})
	ctx := context.Background()
	relay := s.start()
	const events = 400
	s.produce(ctx, events, 8, 1)
	s.mu.Lock()
	held := s.steps[0]
	s.mu.Unlock()
	waitFor(t, func() bool { return len(rc.deliveries()) == events-held && s.deadLetters() == held })
	var reasons int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letter WHERE aggregate_id = 'order-0' AND error LIKE '%sink.held_max_age%'`).Scan(&reasons); err != nil || reasons != held {
		t.Fatalf("%d of %d dead letters of order-0 name sink.held_max_age (%v)", reasons, held, err)
	}
	end := currentWAL(t, s)
	waitFor(t, func() bool {
		var past bool
		err := s.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots
			WHERE database = current_database()`, end).Scan(&past)
		return err == nil && past
	})
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("table-free, one URL broken: %d events delivered, %d dead-lettered after sink.held_max_age", events-held, held)
}

// currentWAL returns the server's current WAL position as text.
func currentWAL(t *testing.T, s *stack) string {
	t.Helper()
	var lsn string
	if err := s.pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

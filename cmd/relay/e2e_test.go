package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// TestEndToEnd runs concurrent producers over 600 aggregates against a
// running relay and checks every guarantee on the wire and in the stream.
// The relay runs as a role with only the privileges `relay init --dry-run
// --role` prints.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: mode, LeastPrivilege: true})
			relay := s.start()
			begin := time.Now()
			s.produce(context.Background(), 12000, 600, 8)
			s.waitDrained(120 * time.Second)
			elapsed := time.Since(begin)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("relay exited %d after SIGTERM, want 0", code)
			}
			wire, stream := s.verify()
			t.Logf("end to end (%s): %s in %.1fs; stream: %s", mode, wire, elapsed.Seconds(), stream)
		})
	}
}

// TestKillAndRestart kills the relay with SIGKILL at random moments while
// producers write, restarts it each time, and checks that nothing is lost,
// every copy carries its row's message_id and per-aggregate order holds.
// RELAY_SOAK=1 runs many more rounds. The relay runs with least privilege
// (see TestEndToEnd).
func TestKillAndRestart(t *testing.T) {
	t.Parallel()
	rounds, events := 8, 12000
	if os.Getenv("RELAY_SOAK") != "" {
		rounds, events = 60, 100000
	}
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: mode, LeastPrivilege: true})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() { s.produce(ctx, events, 600, 8); close(produced) }()
			kills := 0
			for done := false; !done || kills < rounds; {
				relay := s.start()
				select {
				case <-produced:
					done = true
				case <-time.After(time.Duration(100+rand.IntN(700)) * time.Millisecond):
				}
				relay.kill()
				kills++
			}
			s.start()
			s.waitDrained(120 * time.Second)
			wire, stream := s.verify()
			t.Logf("kill -9 %d times (%s): %s; stream: %s", kills, mode, wire, stream)
		})
	}
}

// TestGracefulStop stops the relay with SIGTERM mid-stream: it exits 0,
// and a restarted relay finishes the work.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	relay := s.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 6000, 500, 4); close(produced) }()
	s.waitPublishing()
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("relay exited %d after SIGTERM, want 0:\n%s", code, relay.logs.String())
	}
	<-produced
	s.start()
	s.waitDrained(60 * time.Second)
	wire, _ := s.verify()
	if wire.Duplicates != 0 {
		t.Errorf("a restart after SIGTERM published %d duplicates, want 0", wire.Duplicates)
	}
	t.Logf("graceful stop: %s", wire)
}

// TestPoisonRowDeadLettered puts a malformed row among good ones of the same
// aggregate: it goes to the dead-letter table with its error, and the rest
// are published in order.
func TestPoisonRowDeadLettered(t *testing.T) {
	t.Parallel()
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

// insertPoison inserts a row of aggregate poison-1 whose headers are not a
// JSON object, which the relay dead-letters as permanent, counts it as
// written and returns its id.
func (s *stack) insertPoison(t *testing.T) string {
	t.Helper()
	poison := uuid.NewString()
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, 'order', 'poison-1', 'step', '{"aggregate":"poison-1","step":1}', '["not", "a", "map"]')`, poison); err != nil {
		t.Fatal(err)
	}
	s.wire.Written(poison, "poison-1", 1)
	s.stream.Written(poison, "poison-1", 1)
	return poison
}

// TestDeadLetterRedrive dead-letters a malformed row, lists it, repairs it
// in the dead-letter table, redrives it and sees it published with its
// original id; then drop empties the table. The relay and the dlq commands
// run with least privilege plus INSERT on the outbox, which redrive needs
// (docs/operations.md).
func TestDeadLetterRedrive(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{LeastPrivilege: true})
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, "GRANT INSERT ON outbox TO "+s.role); err != nil {
		t.Fatal(err)
	}
	poison := s.insertPoison(t)
	s.produce(ctx, 40, 4, 2)
	relay := s.start()
	defer relay.stop(t, 15*time.Second)
	waitFor(t, func() bool { return s.outboxRows() == 0 })

	out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath)
	if code != 0 || !strings.Contains(out, poison) || !strings.Contains(out, "permanent") || !strings.Contains(out, "order/poison-1") {
		t.Fatalf("dlq list: exit %d\n%s", code, out)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letter SET headers = '{"trace":"t"}' WHERE id = $1`, poison); err != nil {
		t.Fatal(err)
	}
	if out, code := runRelay(t, "dlq", "redrive", "--config", s.cfgPath, "--id", poison); code != 0 || !strings.Contains(out, "redrove 1") ||
		!strings.Contains(out, "redrive: 1/1 dead letters done, 1 back in the outbox") {
		t.Fatalf("dlq redrive: exit %d\n%s", code, out)
	}
	s.waitDrained(30 * time.Second)
	s.verify()
	if out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath); code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq list after redrive: exit %d\n%s", code, out)
	}
	if out, code := runRelay(t, "dlq", "drop", "--config", s.cfgPath, "--id", "not-a-uuid"); code != 2 {
		t.Fatalf("dlq drop with a bad id: exit %d, want 2\n%s", code, out)
	}
	if out, code := runRelay(t, "dlq", "drop", "--config", s.cfgPath, "--aggregate", "poison-1"); code != 0 || !strings.Contains(out, "dropped 0") {
		t.Fatalf("dlq drop: exit %d\n%s", code, out)
	}
}

// waitFor polls cond every 50 ms and fails the test when it is not met
// within 90 s (the suite runs several relays at once on two cores).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 90s")
		}
	}
}

// TestParkAggregate dead-letters an oversized event with
// dead_letter.park_aggregate: the aggregate's later events wait in the
// outbox while other aggregates flow; after the dead letter is repaired and
// redriven, it and the parked events are published in order.
func TestParkAggregate(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Extra: "dead_letter:\n  park_aggregate: true\n"})
	ctx := context.Background()
	ids := make([]string, 5)
	for step := 1; step <= 4; step++ {
		ids[step] = uuid.NewString()
		payload := fmt.Sprintf(`{"aggregate":"parked-1","step":%d}`, step)
		if step == 2 {
			payload = fmt.Sprintf(`{"aggregate":"parked-1","step":2,"pad":%q}`, strings.Repeat("x", 1536<<10))
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, 'order', 'parked-1', 'step', $2, '{"trace":"t"}')`, ids[step], payload); err != nil {
			t.Fatal(err)
		}
		s.wire.Written(ids[step], "parked-1", step)
		s.stream.Written(ids[step], "parked-1", step)
	}
	s.produce(ctx, 400, 40, 4)
	relay := s.start()
	defer relay.stop(t, 15*time.Second)
	waitFor(t, func() bool { return s.outboxRows() == 2 })
	// Events written now are published only after the relay has looked at
	// the parked aggregate again: once they are on the wire, the parked
	// rows must still be waiting.
	s.produce(ctx, 40, 40, 4)
	waitFor(t, func() bool { return len(s.wire.Check().Missing) <= 3 && s.outboxRows() <= 2 })
	if n := s.outboxRows(); n != 2 {
		t.Fatalf("%d rows in the outbox, want the 2 parked ones", n)
	}
	if missing := s.wire.Check().Missing; len(missing) != 3 {
		t.Fatalf("%d events not delivered, want 3 (the dead one and the 2 parked)", len(missing))
	}
	if _, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letter SET payload = '{"aggregate":"parked-1","step":2}' WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}
	if out, code := runRelay(t, "dlq", "redrive", "--config", s.cfgPath, "--aggregate", "parked-1"); code != 0 || !strings.Contains(out, "redrove 1") {
		t.Fatalf("dlq redrive: exit %d\n%s", code, out)
	}
	s.waitDrained(30 * time.Second)
	s.verify()
}

// TestArchiveModes runs archive modes mark and move: published rows are
// marked or moved, never deleted, and retention prunes them. The relay
// runs with least privilege (see TestEndToEnd).
func TestArchiveModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"mark", "move"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Archive: mode, LeastPrivilege: true})
			ctx := context.Background()
			s.produce(ctx, 1000, 50, 4)
			relay := s.start()
			s.waitDrained(30 * time.Second)
			relay.stop(t, 15*time.Second)
			s.verify()
			count := map[string]string{
				"mark": `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`,
				"move": `SELECT count(*) FROM outbox_archive WHERE archived_at IS NOT NULL`,
			}[mode]
			var n int
			if err := s.pool.QueryRow(ctx, count).Scan(&n); err != nil || n != 1000 {
				t.Fatalf("%d rows archived (%v), want 1000", n, err)
			}
			// A relay with a short retention prunes them when it starts.
			time.Sleep(1100 * time.Millisecond)
			rewriteDSN(t, s.cfgPath, "mode: "+mode+"\n", "mode: "+mode+"\n  retention: 1s\n")
			s.grant()
			relay = s.start()
			defer relay.stop(t, 15*time.Second)
			waitFor(t, func() bool {
				s.pool.QueryRow(ctx, count).Scan(&n)
				return n == 0
			})
		})
	}
}

// TestRunWithoutInit runs relay run on an outbox the application created
// by hand: run creates the dead-letter table, the publication, the slot and
// the NATS stream itself, and rows written before it started are published.
func TestRunWithoutInit(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: mode, NoInit: true})
			ctx := context.Background()
			s.produce(ctx, 600, 60, 3)
			relay := s.start()
			s.produce(ctx, 600, 60, 3)
			s.waitDrained(30 * time.Second)
			relay.stop(t, 15*time.Second)
			s.verify()
			var dl bool
			s.pool.QueryRow(ctx, `SELECT to_regclass('public.outbox_dead_letter') IS NOT NULL`).Scan(&dl)
			if !dl {
				t.Error("relay run did not create the dead-letter table")
			}
		})
	}
}

// TestDLQDropResequencesParked checks that `relay dlq drop` of a parked
// aggregate's dead letter (dead_letter.park_aggregate) moves the rows it
// left in the outbox after every other row, in their order and with their
// ids, as redrive does: a poller whose cursor passed their old seq would
// otherwise publish the aggregate's next new event before them. It also
// checks that redrive and drop without a filter need --all.
func TestDLQDropResequencesParked(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Extra: "dead_letter:\n  park_aggregate: true\n"})
	ctx := context.Background()
	var parked []string
	for i, agg := range []string{"x", "x", "x", "y", "y", "z"} {
		id := uuid.NewString()
		if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', $2, 'step', '{}')`, id, agg); err != nil {
			t.Fatal(err)
		}
		if agg == "x" && i > 0 {
			parked = append(parked, id)
		}
	}
	if _, err := s.pool.Exec(ctx, `WITH dead AS (DELETE FROM outbox WHERE seq = (SELECT min(seq) FROM outbox) RETURNING *)
		INSERT INTO outbox_dead_letter (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq, error, error_class, attempts)
		SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq, 'too large', 'permanent', 1 FROM dead`); err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"redrive", "drop"} {
		out, code := runRelay(t, "dlq", action, "--config", s.cfgPath)
		if code != 2 || !strings.Contains(out, "--all") {
			t.Errorf("dlq %s without a filter: exit %d, want 2 naming --all\n%s", action, code, out)
		}
	}
	if out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath); code != 0 || !strings.Contains(out, "order/x") {
		t.Fatalf("dlq list: exit %d\n%s", code, out)
	}
	if out, code := runRelay(t, "dlq", "drop", "--config", s.cfgPath, "--all"); code != 0 || !strings.Contains(out, "dropped 1") {
		t.Fatalf("dlq drop --all: exit %d\n%s", code, out)
	}
	rows, err := s.pool.Query(ctx, `SELECT id::text FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 5 || !slices.Equal(ids[3:], parked) {
		t.Fatalf("outbox in seq order %v: want the parked rows %v last, in their order", ids, parked)
	}
}

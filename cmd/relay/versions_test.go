package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestPostgresVersions runs a short scenario on every supported PostgreSQL
// major version, in both capture modes: producers write while the relay
// runs, the relay is killed with SIGKILL, more events are written while it
// is down (in wal mode after its slot was dropped, so they are published
// from the table when the slot is recreated), and a new relay publishes
// everything without loss or order breaks. Binaries come from
// testenv.PostgresBin (scripts/deps.sh installs them).
func TestPostgresVersions(t *testing.T) {
	t.Parallel()
	for _, major := range testenv.PostgresMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			t.Parallel()
			bin, err := testenv.PostgresBin(major)
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
			for _, mode := range []string{"poll", "wal"} {
				t.Run(mode, func(t *testing.T) { versionScenario(t, pg, mode) })
			}
		})
	}
}

func versionScenario(t *testing.T, pg *testenv.Postgres, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	dsn, err := pg.CreateDatabase(ctx, "app_"+mode)
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{Mode: mode, DSN: dsn})
	relay := s.start()
	s.produce(ctx, 200, 20, 2)
	waitFor(t, func() bool { return s.wire.Check().Distinct >= 100 })
	relay.kill()
	if mode == "wal" {
		dropSlot(t, s)
	}
	s.produce(ctx, 200, 20, 2)
	relay = s.start()
	s.produce(ctx, 100, 20, 2)
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	if mode == "wal" && !strings.Contains(relay.logs.String(), "publishing outbox rows committed before the slot existed") {
		t.Errorf("the relay did not publish the rows committed while the slot was missing from the table")
	}
	if mode == "wal" {
		checkSlotObserved(t, s, relay.logs.String())
	}
	var version string
	s.pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	t.Logf("PostgreSQL %s, %s: end to end, kill -9, restart%s: %s in %.1fs", version, mode,
		map[string]string{"wal": ", slot dropped and recreated"}[mode], wire, time.Since(begin).Seconds())
}

// dropSlot drops the database's replication slot once the walsender of a
// killed relay, which the server may not have noticed yet, let go of it.
func dropSlot(t *testing.T, s *stack) {
	t.Helper()
	waitFor(t, func() bool {
		_, err := s.pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid), pg_drop_replication_slot(slot_name)
			FROM pg_replication_slots WHERE database = current_database()`)
		return err == nil
	})
}

// checkSlotObserved fails unless the relay, whose logs are given, and
// `relay check` could read the slot's WAL guardrails.
func checkSlotObserved(t *testing.T, s *stack, logs string) {
	t.Helper()
	if strings.Contains(logs, "replication slot observation failed") {
		t.Errorf("the relay could not observe its slot:\n%s", logs)
	}
	if out, _ := runRelay(t, "check", "--config", s.cfgPath); !strings.Contains(out, "bytes of WAL retained") {
		t.Errorf("check does not show the slot's WAL retention:\n%s", out)
	}
}

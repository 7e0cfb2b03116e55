package main

import (
	"context"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"fmt"
	"github.com/outboxrelay/relay/internal/testenv"
	"os"
	"strings"
	"testing"
)

// TestCheckWALGuardrails runs `relay check` in wal mode as the
// least-privileged role `relay init --role` prepares: the slot's WAL
// retention is readable to it, and the server's default unlimited
// max_slot_wal_keep_size is a warning with the statement to run, which
// does not fail the check. capture.wal.failover on a server older than
// PostgreSQL 17 fails check, init and run with exit status 1 naming the key.
func TestCheckWALGuardrails(t *testing.T) {
	s := newStack(t, stackOptions{Mode: "wal", LeastPrivilege: true})
	out, code := runRelay(t, "check", "--config", s.cfgPath)
	if code != 0 || strings.Contains(out, "FAIL") {
		t.Fatalf("check: exit %d, want 0 without FAIL:\n%s", code, out)
	}
	for _, want := range []string{"bytes of WAL retained", "WARN  max_slot_wal_keep_size: -1 (unlimited)",
		"ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf();"} {
		if !strings.Contains(out, want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}

	b, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	failover := writeConfig(t, strings.Replace(string(b), "  wal:\n", "  wal:\n    failover: true\n", 1))
	var version string
	if err := s.pool.QueryRow(t.Context(), `SHOW server_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("capture.wal.failover: true needs PostgreSQL 17 or later, and this server is %s", version)
	for _, cmd := range []string{"check", "init", "run"} {
		out, code := runRelay(t, cmd, "--config", failover)
		if code != 1 || !strings.Contains(out, want) {
			t.Errorf("%s with failover on PostgreSQL %s: exit %d, want 1 and %q:\n%s", cmd, version, code, want, out)
		}
	}
}

// TestPostgres17FailoverSlot runs the wal relay against a PostgreSQL 17
// primary and a synchronous standby that synchronizes failover slots
// (sync_replication_slots, hot_standby_feedback, primary_slot_name, dbname
// in primary_conninfo; synchronized_standby_slots on the primary). The
// primary is killed mid-stream and the standby promoted. With
// capture.wal.failover the relay continues from the synchronized slot: no
// recreation, no drain of the table; without it the slot is missing and
// recreated. Both lose nothing and keep order; the duplicates of each are
// logged.
func TestPostgres17FailoverSlot(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("failover=%v", on), func(t *testing.T) {
			t.Parallel()
			failoverSlot(t, on)
		})
	}
}

func failoverSlot(t *testing.T, on bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := testenv.PostgresBin(17)
	if err != nil {
		t.Fatal(err)
	}
	primary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Bin: bin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	if _, err := primary.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	standby, err := primary.StartStandby(ctx, testenv.PostgresOptions{Settings: map[string]string{
		"sync_replication_slots": "on", "hot_standby_feedback": "on"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	admin, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronized_standby_slots = '%s'`, standby.PrimarySlot()))
	if err == nil {
		_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	}
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}

	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/app?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: "wal", DSN: dsn, Extra: "http:\n  listen: " + addr + "\nretry:\n  max: 1s\n"})
	b, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	slot := regexp.MustCompile(`slot: (\w+)`).FindStringSubmatch(string(b))[1]
	if on {
		s.cfgPath = writeConfig(t, strings.Replace(string(b), "  wal:\n", "  wal:\n    failover: true\n", 1))
	}
	relay := s.start()
	marker := s.watchAggregate(markerAggregate)

	if on { // the slot exists on the standby before the run the kill interrupts
		sb, err := pgx.Connect(ctx, standby.DSN("app"))
		if err != nil {
			t.Fatal(err)
		}
		// The standby keeps the slot once the primary's copy moved past
		// where the standby started reserving WAL: events move it.
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			var synced bool
			err := sb.QueryRow(ctx, `SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&synced)
			if err == nil && synced {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("slot %s not synchronized to the standby within 90s (last error %v)", slot, err)
			}
			if _, err := s.write(ctx, 0, 1); err != nil {
				t.Fatal(err)
			}
		}
		sb.Close(ctx)
	}
	produced := make(chan struct{})
	go func() { s.produce(ctx, 3000, 300, 3); close(produced) }()
	waitFor(t, func() bool { return s.wire.Check().Distinct >= 600 })
	atKill := s.wire.Check().Distinct
	_, resumed := s.failOver(ctx, primary, standby, marker)
	<-produced
	s.waitDrained(60 * time.Second)
	// The slot guard reads the slot on the new primary in the background.
	recreated := `relay_replication_slot_recreated_total{reason="failover"} 1`
	var metrics string
	if on {
		metrics = waitMetrics(t, addr, "relay_replication_slot_failover 1")
	} else {
		metrics = waitMetrics(t, addr, recreated)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, stream := s.verify()
	if on && strings.Contains(metrics, recreated) {
		t.Errorf("failover on: metrics have %q", recreated)
	}
	t.Logf("PostgreSQL 17, capture.wal.failover %v: killed after %d deliveries; %d events written, %d lost, %d duplicates on the wire, %d order breaks; stream %s; publishing resumed %.2fs after the kill",
		on, atKill, wire.Written, len(wire.Missing), wire.Duplicates, len(wire.OrderBreaks), stream, resumed.Seconds())
}

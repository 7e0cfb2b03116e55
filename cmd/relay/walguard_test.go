package main

import (
	"fmt"
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

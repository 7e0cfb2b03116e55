package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func queryString(t *testing.T, conn *pgx.Conn, sql string) string {
	t.Helper()
	var s string
	if err := conn.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestPostgresNewDBIndependent(t *testing.T) {
	t.Parallel()
	dsnA, dsnB := NewDB(t), NewDB(t)
	if dsnA == dsnB {
		t.Fatalf("two NewDB calls returned the same DSN %s", dsnA)
	}
	a, b := connect(t, dsnA), connect(t, dsnB)
	mustExec(t, a, "CREATE TABLE only_in_a (id int)")
	if got := queryString(t, b, "SELECT coalesce(to_regclass('only_in_a')::text, 'missing')"); got != "missing" {
		t.Fatalf("table created in database A is visible in B: %s", got)
	}
}

func TestPostgresSettings(t *testing.T) {
	t.Parallel()
	conn := connect(t, NewDB(t))
	want := map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": "20",
		"max_wal_senders":       "20",
		"max_connections":       "200",
		"fsync":                 "off",
		"synchronous_commit":    "on",
		"listen_addresses":      "127.0.0.1",
	}
	for name, value := range want {
		if got := queryString(t, conn, "SHOW "+name); got != value {
			t.Errorf("%s = %q, want %q", name, got, value)
		}
	}
}

// TestPostgresNewDBDropsSlots checks that NewDB's cleanup drops an idle
// slot and one a walsender (pg_recvlogical) is streaming from.
func TestPostgresNewDBDropsSlots(t *testing.T) {
	t.Parallel()
	var name string
	var recv *exec.Cmd
	t.Run("create", func(t *testing.T) {
		dsn := NewDB(t)
		conn := connect(t, dsn)
		name = queryString(t, conn, "SELECT current_database()")
		mustExec(t, conn, "SELECT pg_create_logical_replication_slot('idle', 'test_decoding')")
		mustExec(t, conn, "SELECT pg_create_logical_replication_slot('streaming', 'test_decoding')")
		recv = exec.Command(filepath.Join(shared.pg.Bin(), "pg_recvlogical"),
			"-d", dsn, "-S", "streaming", "--start", "--no-loop", "-f", os.DevNull)
		if err := recv.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, conn, "SELECT active FROM pg_replication_slots WHERE slot_name = 'streaming'")
	})
	defer func() { _ = recv.Process.Kill(); _ = recv.Wait() }()
	conn := connect(t, shared.pg.DSN("postgres"))
	var n int
	err := conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_replication_slots WHERE database = $1", name).Scan(&n)
	if err != nil || n != 0 {
		t.Fatalf("slots left in database %s after the test: %d (%v)", name, n, err)
	}
	if got := queryString(t, conn, "SELECT count(*)::text FROM pg_database WHERE datname = '"+name+"'"); got != "0" {
		t.Errorf("database %s not dropped after the test", name)
	}
}

// waitFor polls a boolean query until it is true, for up to 10 seconds.
func waitFor(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var ok bool
		if err := conn.QueryRow(context.Background(), sql).Scan(&ok); err == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", sql)
}

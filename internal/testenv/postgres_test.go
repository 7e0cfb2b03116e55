package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
		recv = exec.Command(filepath.Join(shared.pg.bin, "pg_recvlogical"),
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

// startPrivate starts a cluster of the test's own, for tests that stop it.
func startPrivate(t *testing.T, opts PostgresOptions) *Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	pg, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster started in %v on port %d", time.Since(begin).Round(time.Millisecond), pg.Port())
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return pg
}

func TestPostgresRestartKeepsData(t *testing.T) {
	t.Parallel()
	pg := startPrivate(t, PostgresOptions{Settings: map[string]string{"work_mem": "8MB"}})
	ctx := context.Background()
	dsn, err := pg.CreateDatabase(ctx, "Mixed Case")
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, dsn)
	mustExec(t, conn, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before restart')")
	if got := queryString(t, conn, "SHOW work_mem"); got != "8MB" {
		t.Errorf("work_mem = %q, want 8MB from PostgresOptions.Settings", got)
	}
	port := pg.Port()
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("connection from before the restart still works")
	}
	if pg.Port() != port {
		t.Errorf("port changed from %d to %d", port, pg.Port())
	}
	if got := queryString(t, connect(t, dsn), "SELECT v FROM kept"); got != "before restart" {
		t.Errorf("after restart got %q", got)
	}
}

func TestPostgresStopStartServer(t *testing.T) {
	t.Parallel()
	pg := startPrivate(t, PostgresOptions{})
	ctx := context.Background()
	dsn, err := pg.CreateDatabase(ctx, "outage")
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, connect(t, dsn), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before outage')")
	if err := pg.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.StopServer(ctx); err != nil {
		t.Errorf("second StopServer: %v", err)
	}
	if conn, err := pgx.Connect(ctx, dsn); err == nil {
		conn.Close(ctx)
		t.Fatal("connected while the server was stopped")
	}
	if err := pg.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, connect(t, dsn), "SELECT v FROM kept"); got != "before outage" {
		t.Errorf("after StopServer/StartServer got %q", got)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := os.Stat(pg.Dir()); !os.IsNotExist(err) {
		t.Errorf("Stop left %s behind (%v)", pg.Dir(), err)
	}
}

func TestPostgresStartFailureReportsLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := StartPostgres(ctx, PostgresOptions{Settings: map[string]string{"wal_level": "bogus"}})
	if err == nil {
		pg.Stop()
		t.Fatal("StartPostgres succeeded with wal_level=bogus")
	}
	msg := err.Error()
	if !strings.Contains(msg, `invalid value for parameter "wal_level"`) {
		t.Errorf("error does not include the server log: %v", err)
	}
	m := regexp.MustCompile(`tail of (\S+)/server\.log`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("error does not name the server log: %v", err)
	}
	if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("failed start left %s behind (%v)", m[1], err)
	}
}

// TestPostgresWatchdog kills a process that started a cluster and checks
// that the watchdog stops the server and removes its directory.
func TestPostgresWatchdog(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPostgresWatchdogHelper$")
	cmd.Env = append(os.Environ(), "TESTENV_WATCHDOG_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, dsn string
	if _, err := fmt.Fscanln(out, &dir, &dsn); err != nil {
		cmd.Process.Kill()
		t.Fatalf("helper did not report its cluster: %v", err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 30s after its process was killed", dir)
		}
	}
	if conn, err := pgx.Connect(context.Background(), dsn); err == nil {
		conn.Close(context.Background())
		t.Fatalf("server at %s still running after its process was killed", dsn)
	}
}

// TestPostgresWatchdogHelper is the process TestPostgresWatchdog kills.
func TestPostgresWatchdogHelper(t *testing.T) {
	if os.Getenv("TESTENV_WATCHDOG_HELPER") == "" {
		return
	}
	pg, err := StartPostgres(context.Background(), PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(pg.Dir(), pg.DSN("postgres"))
	time.Sleep(time.Minute)
}

package embedded

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

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

package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// hardPassword holds a blank and every character a postgres URL or a
// key=value string reserves.
const hardPassword = `Pg S3cr3t w/rd#1?&%@:`

// passwordDB starts a cluster that requires a password (scram-sha-256)
// from every role but postgres, creates role app_pw with password pw
// owning a database app, and returns the server's port.
func passwordDB(t *testing.T, pw string) int {
	t.Helper()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	hba := filepath.Join(pg.Dir(), "data", "pg_hba.conf")
	rules := "host all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hba, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, stmt := range []string{
		"CREATE ROLE app_pw LOGIN PASSWORD '" + strings.ReplaceAll(pw, "'", "''") + "'",
		"CREATE DATABASE app OWNER app_pw", "SELECT pg_reload_conf()",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	return pg.Port()
}

// startNATS starts a NATS server for the test and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	return n.URL()
}

// leaked returns the first substring of pw of 4 bytes or more found in
// out, or "".
func leaked(out, pw string) string {
	for i := 0; i+4 <= len(pw); i++ {
		if strings.Contains(out, pw[i:i+4]) {
			return pw[i : i+4]
		}
	}
	return ""
}

// TestPasswordNeverPrinted runs init, check and run with a password
// holding a blank and the characters URLs and key=value strings reserve:
// from postgres.password (${VAR}) and postgres.password_file they connect;
// in postgres.url unencoded, each command says what is wrong (exit 2 for
// init and run) and prints no 4 characters of the password; properly
// quoted or percent-encoded in postgres.url, it connects; an unset
// variable is named with its key and line.
func TestPasswordNeverPrinted(t *testing.T) {
	port := passwordDB(t, hardPassword)
	rest := "capture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: " + startNATS(t) + "\n"
	base := fmt.Sprintf("postgres://app_pw@127.0.0.1:%d/app?sslmode=disable", port)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(hardPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RELAY_TEST_PW", hardPassword)
	kv := fmt.Sprintf("host=127.0.0.1 port=%d user=app_pw dbname=app sslmode=disable", port)
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(hardPassword)

	good := map[string]string{
		"password":      "postgres:\n  url: " + base + "\n  password: ${RELAY_TEST_PW}\n",
		"password_file": "postgres:\n  url: " + base + "\n  password_file: " + pwFile + "\n",
		"quoted":        "postgres:\n  url: \"" + kv + " password='" + quoted + "'\"\n",
		"encoded": "postgres:\n  url: " + strings.Replace(base, "app_pw@", "app_pw:"+
			strings.ReplaceAll(url.QueryEscape(hardPassword), "+", "%20")+"@", 1) + "\n",
	}
	for name, pg := range good {
		cfg := writeConfig(t, pg+rest)
		if out, code := runRelay(t, "init", "--config", cfg); code != 0 || leaked(out, hardPassword) != "" {
			t.Errorf("%s: init exit %d\n%s", name, code, out)
		}
		out, code := runRelay(t, "check", "--config", cfg)
		if code != 0 || !strings.Contains(out, "ok    postgres postgres://app_pw@127.0.0.1:") || leaked(out, hardPassword) != "" {
			t.Errorf("%s: check\n%s", name, out)
		}
	}

	bad := map[string]struct{ pg, want string }{
		"key=value unquoted": {"postgres:\n  url: " + kv + " password=${RELAY_TEST_PW}\n",
			"postgres.url: cannot parse as keyword/value settings"},
		"URL unencoded": {"postgres:\n  url: " + strings.Replace(base, "app_pw@", "app_pw:${RELAY_TEST_PW}@", 1) + "\n",
			"postgres.url: the password (or user) holds characters a URL reserves"},
		"URL unencoded, no blank": {"postgres:\n  url: " + strings.Replace(base, "app_pw@", "app_pw:w/rd#1?x@", 1) + "\n",
			"postgres.url: the password (or user) holds characters a URL reserves"},
		"unset variable": {"postgres:\n  url: " + base + "\n  password: ${RELAY_TEST_UNSET_PW}\n",
			"relay.yaml:3: postgres.password: ${RELAY_TEST_UNSET_PW} is not set"},
	}
	for name, tt := range bad {
		cfg := writeConfig(t, tt.pg+rest)
		for _, cmd := range []string{"init", "check", "run"} {
			out, code := runRelay(t, cmd, "--config", cfg)
			if code == 0 || !strings.Contains(out, tt.want) {
				t.Errorf("%s: %s exit %d, want %q\n%s", name, cmd, code, tt.want, out)
			}
			if cmd != "check" && code != 2 {
				t.Errorf("%s: %s exit %d, want 2", name, cmd, code)
			}
			if s := leaked(out, hardPassword); s != "" || strings.Contains(out, "w/rd") {
				t.Errorf("%s: %s prints %q of the password\n%s", name, cmd, s, out)
			}
		}
	}

	cfg := writeConfig(t, good["password"]+rest)
	relay := startProc(t, context.Background(), "run", "--config", cfg)
	waitFor(t, func() bool { return strings.Contains(relay.logs.String(), "relay running") })
	relay.stop(t, 30*time.Second)
	if s := leaked(relay.logs.String(), hardPassword); s != "" {
		t.Errorf("run prints %q of the password\n%s", s, relay.logs.String())
	}
}

// TestInitRoleWALWithoutSuperuser runs `relay init --role` in wal mode as
// a table owner that is no superuser but has REPLICATION: for a role that
// may replicate already it grants the rest and succeeds; for one that may
// not, it grants the rest, prints the ALTER ROLE a superuser must run, and
// still exits 0.
func TestInitRoleWALWithoutSuperuser(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.NewDB(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	n := roleCounter.Add(1)
	owner, ready, plain := fmt.Sprintf("relay_owner_%d", n), fmt.Sprintf("relay_repl_%d", n), fmt.Sprintf("relay_norepl_%d", n)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"CREATE ROLE " + owner + " LOGIN REPLICATION", "CREATE ROLE " + ready + " LOGIN REPLICATION", "CREATE ROLE " + plain + " LOGIN",
		"GRANT CREATE ON DATABASE " + strings.TrimPrefix(u.Path, "/") + " TO " + owner, "GRANT CREATE ON SCHEMA public TO " + owner,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	u.User = url.User(owner)
	cfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: wal\n  wal:\n    slot: relay_test_%d\n"+
		"sink:\n  type: nats\n  nats:\n    url: %s\n", u, slotCounter.Add(1), startNATS(t)))

	out, code := runRelay(t, "init", "--role", ready, "--config", cfg)
	if code != 0 || !strings.Contains(out, "postgres: role "+ready+" may replicate already") ||
		!strings.Contains(out, "postgres: role "+ready+" granted what `relay run` needs") {
		t.Errorf("init --role %s (has REPLICATION): exit %d\n%s", ready, code, out)
	}
	out, code = runRelay(t, "init", "--role", plain, "--config", cfg)
	if code != 0 || !strings.Contains(out, "REPLICATION, which only a superuser can grant") ||
		!strings.Contains(out, "  ALTER ROLE \""+plain+"\" WITH REPLICATION;\n") {
		t.Errorf("init --role %s (no REPLICATION): exit %d\n%s", plain, code, out)
	}
	var granted bool
	if err := admin.QueryRow(ctx, "SELECT has_table_privilege($1, 'public.outbox', 'SELECT')", plain).Scan(&granted); err != nil || !granted {
		t.Errorf("role %s was not granted SELECT on the outbox (%v)", plain, err)
	}
}

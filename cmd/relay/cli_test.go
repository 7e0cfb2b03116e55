package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestBadInput checks each kind of bad input gives a message naming the
// thing and the contract's exit status, without creating anything.
func TestBadInput(t *testing.T) {
	t.Parallel()
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	deadPort := freePort(t)
	base := func(url, extra string) string {
		return fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: %s\n%s", url, n.URL(), extra)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		yaml  string
		code  int
		wants []string
		not   string
	}{
		{name: "no command", code: 2, wants: []string{"usage"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, wants: []string{`unknown command "frobnicate"`}},
		{name: "missing --config", args: []string{"run"}, code: 2, wants: []string{"--config"}},
		{name: "missing file", args: []string{"run", "--config", "/nonexistent.yaml"}, code: 2, wants: []string{"/nonexistent.yaml"}},
		{name: "invalid yaml", args: []string{"run"}, yaml: "postgres:\n  url: [unclosed\n", code: 2, wants: []string{"relay.yaml:"}},
		{name: "unknown key", args: []string{"run"}, yaml: base(dsn, "retry:\n  maximum: 3s\n"), code: 2,
			wants: []string{"relay.yaml:10:", "retry.maximum", "unknown key"}},
		{name: "bad duration", args: []string{"check"}, yaml: base(dsn, "retry:\n  max: 10 seconds\n"), code: 2,
			wants: []string{"relay.yaml:10:", "retry.max", "invalid duration"}},
		{name: "missing required", args: []string{"run"}, yaml: "capture:\n  mode: poll\nsink:\n  type: nats\n", code: 2,
			wants: []string{"postgres.url", "required"}},
		{name: "park_aggregate in wal mode", args: []string{"run"}, yaml: strings.Replace(base(dsn, "dead_letter:\n  park_aggregate: true\n"), "mode: poll", "mode: wal", 1), code: 2,
			wants: []string{"relay.yaml:10:", "dead_letter.park_aggregate", "not offered in wal mode"}},
		{name: "max_conns too small for wal", args: []string{"run"},
			yaml: strings.NewReplacer("mode: poll", "mode: wal", "capture:", "  max_conns: 3\ncapture:").Replace(base(dsn, "")), code: 2,
			wants: []string{"postgres.max_conns", "at least 4"}},
		{name: "unreachable postgres", args: []string{"check"}, yaml: base(fmt.Sprintf("postgres://app:s3cret@127.0.0.1:%d/app", deadPort), ""), code: 1,
			wants: []string{"connect to postgres", "postgres://app@127.0.0.1"}, not: "s3cret"},
		{name: "unreachable nats", args: []string{"check"},
			yaml: strings.Replace(base(dsn, ""), n.URL(), fmt.Sprintf("nats://t0ken@127.0.0.1:%d", deadPort), 1), code: 1,
			wants: []string{"nats", "xxxxx@"}, not: "t0ken"},
		{name: "missing outbox table", args: []string{"run"}, yaml: base(dsn, ""), code: 1,
			wants: []string{"public.outbox", "relay init"}},
		{name: "check reports missing outbox", args: []string{"check"}, yaml: base(dsn, ""), code: 1,
			wants: []string{"FAIL  outbox table public.outbox", "fix:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.yaml != "" {
				args = append(args, "--config", writeConfig(t, tc.yaml))
			}
			out, code := runRelay(t, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if tc.not != "" && strings.Contains(out, tc.not) {
				t.Errorf("output leaks %q:\n%s", tc.not, out)
			}
		})
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables int
	conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables)
	if tables != 0 {
		t.Errorf("bad runs created %d tables", tables)
	}
}

// freePort returns a free loopback port or fails the test.
func freePort(t *testing.T) int {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestInitDryRunAndCheck covers `relay init --dry-run` (prints SQL, changes
// nothing), `relay init`, `relay init --role` granting a role without
// privileges what relay run needs (the schema app too), and `relay check`
// and `relay run` passing afterwards as that role.
func TestInitDryRunAndCheck(t *testing.T) {
	t.Parallel()
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	cfg := writeConfig(t, fmt.Sprintf(`postgres:
  url: %s
outbox:
  table: app.events
  columns: {aggregate_id: order_id}
capture:
  mode: poll
sink:
  type: nats
  nats:
    url: %s
`, dsn, n.URL()))
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE SCHEMA app`); err != nil {
		t.Fatal(err)
	}
	out, code := runRelay(t, "init", "--config", cfg, "--dry-run")
	if code != 0 || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "app"."events"`) || !strings.Contains(out, `"order_id" text NOT NULL`) {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	var exists bool
	conn.QueryRow(ctx, `SELECT to_regclass('app.events') IS NOT NULL`).Scan(&exists)
	if exists {
		t.Fatal("--dry-run created the table")
	}
	if out, code := runRelay(t, "init", "--config", cfg); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	if out, code := runRelay(t, "init", "--config", cfg); code != 0 {
		t.Fatalf("second init is not idempotent: exit %d\n%s", code, out)
	}
	role, roleDSN := newRole(t, conn, dsn)
	if out, code := runRelay(t, "init", "--config", cfg, "--role", role); code != 0 {
		t.Fatalf("init --role: exit %d\n%s", code, out)
	}
	rewriteDSN(t, cfg, dsn, roleDSN)
	if out, code := runRelay(t, "check", "--config", cfg); code != 0 || strings.Contains(out, "FAIL") || !strings.Contains(out, "relay run opens at most 8") {
		t.Fatalf("check as %s after init --role: exit %d\n%s", role, code, out)
	}
	// The trigger notifies and the relay publishes from the remapped table.
	id := uuid.NewString()
	if _, err := conn.Exec(ctx, `INSERT INTO app.events (id, aggregate_type, order_id, event_type, payload) VALUES ($1, 'order', 'o1', 'created', '{}')`, id); err != nil {
		t.Fatal(err)
	}
	cmdCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := startProc(t, cmdCtx, "run", "--config", cfg)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var left int
		conn.QueryRow(ctx, `SELECT count(*) FROM app.events`).Scan(&left)
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("row not published:\n%s", p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestInterruptedCommandsFail checks that init, check and dlq interrupted by
// SIGINT before they finished exit 1, not 0: only run stops on a signal by
// design. Postgres is a listener that accepts and never answers, so each
// command is still connecting when the signal arrives.
func TestInterruptedCommandsFail(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	path := writeConfig(t, fmt.Sprintf("postgres:\n  url: postgres://app@%s/app?connect_timeout=0\ncapture:\n  mode: poll\nsink:\n  type: nats\n", ln.Addr()))
	for _, args := range [][]string{{"init"}, {"check"}, {"dlq", "list"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			p := startProc(t, context.Background(), append(args, "--config", path)...)
			select {
			case c := <-accepted:
				defer c.Close()
			case <-time.After(30 * time.Second):
				t.Fatal("the command never connected")
			}
			p.cmd.Process.Signal(os.Interrupt)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				t.Fatal("no exit within 30s of SIGINT")
			}
			if code := p.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit %d, want 1\n%s", code, p.logs.String())
			}
		})
	}
}

// TestSecretsFromEnvNeverPrinted runs check, dlq list, status (text and
// JSON, which reports the unreachable database) and run with a
// postgres password from the environment holding YAML's special
// characters: the value is used whole (not cut at " #", no alias for "*")
// and no command prints it, even when the URL cannot be parsed.
func TestSecretsFromEnvNeverPrinted(t *testing.T) {
	deadPort := freePort(t)
	cfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: postgres://app:${RELAY_TEST_PW}@127.0.0.1:%d/app?sslmode=disable\n"+
		"capture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: nats://127.0.0.1:%d\n", deadPort, deadPort))
	for _, secret := range []string{"s3cr3t #1", "*star", "pa ss", "it's'q", `dq"uote`, "%zz", "&amp", "!tag"} {
		t.Setenv("RELAY_TEST_PW", secret)
		for _, args := range [][]string{{"check"}, {"dlq", "list"}, {"status"}, {"status", "--json"}} {
			out, code := runRelay(t, append(args, "--config", cfg)...)
			quoted, _ := json.Marshal(secret)
			if code == 0 || strings.Contains(out, secret) || strings.Contains(out, string(quoted[1:len(quoted)-1])) || strings.Contains(out, "alias") {
				t.Errorf("%v with %q: exit %d\n%s", args, secret, code, out)
			}
		}
	}
	t.Setenv("RELAY_TEST_PW", "pa ss")
	out, code := runRelay(t, "run", "--config", cfg)
	if code != 2 || strings.Contains(out, "pa ss") || !strings.Contains(out, "postgres.url") {
		t.Errorf("run with an unparsable URL: exit %d\n%s", code, out)
	}
}

// TestHelp checks that every command answers --help, -h and relay help
// COMMAND with its own usage on stdout and exit 0, within seconds and
// without starting anything (relay demo would start Postgres and NATS and
// print its progress), and that commands without arguments refuse extra
// ones.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "init", "check", "status", "dlq", "demo", "version", "help"} {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}} {
			stdout, stderr, code := runRelaySplit(t, args...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: relay "+cmd) {
				t.Errorf("relay %s: exit %d, want 0 with its usage on stdout\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
			}
		}
	}
	stdout, _, code := runRelaySplit(t, "init", "--help")
	if code != 0 || !strings.Contains(stdout, "-role NAME") || strings.Contains(stdout, "-role relay run") {
		t.Errorf("init --help names --role's value badly:\n%s", stdout)
	}
	for _, args := range [][]string{{"help"}, {"--help"}} {
		if stdout, _, code := runRelaySplit(t, args...); code != 0 || !strings.Contains(stdout, "relay demo") || !strings.Contains(stdout, "relay help [COMMAND]") {
			t.Errorf("relay %v: exit %d\n%s", args, code, stdout)
		}
	}
	for _, args := range [][]string{{"version", "extra"}, {"demo", "extra"}, {"help", "frobnicate"}, {"help", "run", "init"}, {"run", "--bogus"}} {
		if _, stderr, code := runRelaySplit(t, args...); code != 2 || stderr == "" {
			t.Errorf("relay %v: exit %d, want 2 with a message\n%s", args, code, stderr)
		}
	}
}

// runRelaySplit runs a relay command that must finish within 20 seconds
// and returns its stdout, its stderr and its exit status.
func runRelaySplit(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr strings.Builder
	cmd := exec.CommandContext(ctx, relayBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Errorf("relay %v did not finish within 20s", args)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("relay %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

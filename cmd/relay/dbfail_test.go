package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// TestLastingDatabaseFailure runs the relay as a role that lacks one grant:
// in poll mode UPDATE on the outbox, so the claim (FOR UPDATE SKIP LOCKED)
// fails; in wal mode DELETE on the outbox, so every archive fails. Neither
// passes by itself: the relay must log one line naming the GRANT that fixes
// it, not retry silently as if Postgres were down, and exit 1 once
// postgres.fatal_after has passed, with every row still in the outbox.
func TestLastingDatabaseFailure(t *testing.T) {
	for _, tc := range []struct{ mode, missing, fix string }{
		{"poll", "UPDATE", `GRANT SELECT, DELETE, UPDATE ("id") ON "public"."outbox"`},
		{"wal", "DELETE", `GRANT SELECT, DELETE ON "public"."outbox"`},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			s := newStack(t, stackOptions{Mode: tc.mode, Extra: "retry:\n  initial: 50ms\n  max: 500ms\n"})
			ctx := context.Background()
			role := fmt.Sprintf("limited_%s_%d", tc.mode, slotCounter.Add(1))
			for _, stmt := range []string{
				"CREATE ROLE " + role + " LOGIN REPLICATION",
				"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
				"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO " + role,
				"GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
				// relay run still issues CREATE … IF NOT EXISTS for these.
				"GRANT CREATE ON SCHEMA public TO " + role,
				"ALTER TABLE outbox_dead_letter OWNER TO " + role,
				"ALTER TABLE IF EXISTS outbox_relay_drain OWNER TO " + role,
				"REVOKE " + tc.missing + " ON outbox FROM " + role,
			} {
				if _, err := s.pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			t.Cleanup(func() {
				s.pool.Exec(context.Background(), "DROP OWNED BY "+role)
				s.pool.Exec(context.Background(), "DROP ROLE "+role)
			})
			u, err := url.Parse(s.dsn)
			if err != nil {
				t.Fatal(err)
			}
			u.User = url.User(role)
			cfg, err := os.ReadFile(s.cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			cfg = []byte(strings.Replace(string(cfg), "  url: "+s.dsn+"\n", "  url: "+u.String()+"\n  fatal_after: 3s\n", 1))
			if err := os.WriteFile(s.cfgPath, cfg, 0o600); err != nil {
				t.Fatal(err)
			}
			s.produce(ctx, 5, 1, 1)
			p := startProc(t, ctx, "run", "--config", s.cfgPath)
			select {
			case <-p.done:
			case <-time.After(90 * time.Second):
				t.Fatal("the relay did not exit within 90s")
			}
			logs := p.logs.String()
			if code := p.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if n := strings.Count(logs, "will not pass by itself"); n != 1 {
				t.Errorf("%d lines say the failure will not pass, want 1", n)
			}
			for _, want := range []string{"permission denied", tc.fix, "postgres.fatal_after"} {
				if !strings.Contains(logs, want) {
					t.Errorf("log lacks %q", want)
				}
			}
			if strings.Contains(logs, "capture failed, retrying") {
				t.Error("the failure was retried as a transient one")
			}
			if n := s.outboxRows(); n != 5 {
				t.Errorf("%d rows in the outbox, want all 5", n)
			}
			if t.Failed() {
				t.Logf("relay log:\n%s", logs)
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// TestLastingDatabaseFailure takes one grant from the relay's role while
// the relay runs (a role lacking it from the start is refused at start, see
// TestRunRefusesWithoutGrant): in poll mode UPDATE on the outbox, so the
// claim (FOR UPDATE SKIP LOCKED) fails; in wal mode DELETE on the outbox, so
// every archive fails. Neither passes by itself: the relay must log one line
// naming the GRANT that fixes it, not retry silently as if Postgres were
// down, and exit 1 once postgres.fatal_after has passed, with every row
// written since still in the outbox.
func TestLastingDatabaseFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mode, missing, fix string }{
		{"poll", "UPDATE", `GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox"`},
		{"wal", "DELETE", `GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox"`},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: tc.mode, Extra: "retry:\n  initial: 50ms\n  max: 500ms\nhttp:\n  listen: " + addr + "\n"})
			ctx := context.Background()
			role := fmt.Sprintf("limited_%s_%d", tc.mode, slotCounter.Add(1))
			for _, stmt := range []string{
				"CREATE ROLE " + role + " LOGIN REPLICATION",
				"GRANT SELECT ON ALL TABLES IN SCHEMA public TO " + role,
				"GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO " + role,
				"GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO " + role,
				"ALTER TABLE outbox_dead_letter OWNER TO " + role,
				"ALTER TABLE IF EXISTS outbox_relay_drain OWNER TO " + role,
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
			cfg = []byte(strings.Replace(string(cfg), "  url: "+s.dsn+"\n", "  url: "+u.String()+"\n  fatal_after: 6s\n", 1))
			if err := os.WriteFile(s.cfgPath, cfg, 0o600); err != nil {
				t.Fatal(err)
			}
			p := startProc(t, ctx, "run", "--config", s.cfgPath)
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			if _, err := s.pool.Exec(ctx, "REVOKE "+tc.missing+" ON outbox FROM "+role); err != nil {
				t.Fatal(err)
			}
			s.produce(ctx, 5, 1, 1)
			notReady := waitCaptureNotReady(addr, p.done)
			select {
			case <-p.done:
			case <-time.After(90 * time.Second):
				t.Fatal("the relay did not exit within 90s")
			}
			if !notReady {
				t.Error("relay_capture_ready never went to 0 while the database refused the relay")
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

// waitCaptureNotReady scrapes addr's /metrics until relay_capture_ready is
// 0, and reports whether it was, or false once done is closed.
func waitCaptureNotReady(addr string, done <-chan struct{}) bool {
	c := http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			return false
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := c.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "\nrelay_capture_ready 0\n") {
			return true
		}
	}
}

// TestMixedRelaysRefused starts a relay and then one with another capture
// configuration on the same outbox: poll with other partitions, or wal
// beside poll (and poll beside wal). The second must exit 1 naming both
// configurations, while the first keeps running; one with the same
// configuration joins.
func TestMixedRelaysRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ first, second, want string }{
		{"poll", "poll8", "capture.mode poll and capture.poll.partitions 16, this one with capture.mode poll and capture.poll.partitions 8"},
		{"poll", "wal", "capture.mode poll and capture.poll.partitions 16, this one with capture.mode wal"},
		{"wal", "poll", "capture.mode wal, this one with capture.mode poll and capture.poll.partitions 16"},
	} {
		t.Run(tc.first+"_then_"+tc.second, func(t *testing.T) {
			s := newStack(t, stackOptions{Mode: tc.first})
			first := s.start()
			s.produce(context.Background(), 5, 1, 1)
			s.waitDrained(30 * time.Second) // the first relay captures, so it joined
			out, code := runRelay(t, "run", "--config", modeConfig(t, s.cfgPath, tc.first, tc.second))
			if code != 1 || !strings.Contains(out, "another relay runs on outbox public.outbox with "+tc.want) {
				t.Fatalf("second relay: exit %d, want 1 naming both configurations\n%s", code, out)
			}
			same := s.start()
			waitFor(t, func() bool { return strings.Contains(same.logs.String(), "relay running") })
			s.produce(context.Background(), 20, 4, 1)
			s.waitDrained(30 * time.Second)
			for _, p := range []*relayProc{first, same} {
				if code := p.stop(t, 15*time.Second); code != 0 {
					t.Errorf("a relay with the first configuration exited %d\n%s", code, p.logs.String())
				}
			}
			s.verify()
		})
	}
}

// modeConfig writes a copy of the config at path with capture mode second
// ("poll8": poll with 8 partitions) instead of first.
func modeConfig(t *testing.T, path, first, second string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	switch second {
	case "poll8":
		cfg = strings.Replace(cfg, "    interval: 50ms\n", "    interval: 50ms\n    partitions: 8\n", 1)
	default:
		cfg = strings.Replace(cfg, "  mode: "+first+"\n", "  mode: "+second+"\n", 1)
	}
	return writeConfig(t, cfg)
}

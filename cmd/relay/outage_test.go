package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// readinessBound is how long after Postgres stops or starts an idle relay
// has to answer /readyz and relay_capture_ready accordingly.
const readinessBound = 15 * time.Second

// outageLength is how long the test keeps Postgres down.
const outageLength = 15 * time.Second

// TestIdleRelayFollowsPostgres stops and starts the Postgres server of
// idle relays, with no event written around the outage: in poll mode one
// relay, in wal mode a leader and a relay standing by for it. Each must
// answer /readyz 503 with relay_capture_ready 0 within readinessBound of
// the stop, and 200 with 1 within readinessBound of the start, and log
// the outage in a few lines, not one per retry; then an event written is
// delivered.
func TestIdleRelayFollowsPostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			pg, err := testenv.StartPostgres(context.Background(), testenv.PostgresOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pg.Stop() })
			dsn, err := pg.CreateDatabase(context.Background(), "app")
			if err != nil {
				t.Fatal(err)
			}
			s := newStack(t, stackOptions{DSN: dsn, Mode: mode})
			addrs := []string{s.withHTTP()}
			relays := []*relayProc{s.start()}
			if mode == "wal" {
				waitFor(t, func() bool { return strings.Contains(relays[0].logs.String(), "wal capture active") })
				addr, cfg := s.otherListener(addrs[0])
				addrs = append(addrs, addr)
				relays = append(relays, startProc(t, context.Background(), "run", "--config", cfg))
				waitFor(t, func() bool { return strings.Contains(relays[1].logs.String(), "standing by") })
			}
			if !waitCapture(t, addrs, true, 90*time.Second) {
				t.FailNow()
			}

			marks := make([]int, len(relays))
			for i, r := range relays {
				marks[i] = r.logs.Len()
			}
			if err := pg.StopServer(context.Background()); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			waitCapture(t, addrs, false, readinessBound)
			time.Sleep(time.Until(stopped.Add(outageLength)))
			if err := pg.StartServer(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitCapture(t, addrs, true, readinessBound)
			for i, r := range relays {
				checkOutageLog(t, i, r.logs.String()[marks[i]:])
			}
			if t.Failed() {
				t.FailNow()
			}

			waitFor(t, func() bool { _, err := s.write(context.Background(), 0, 1); return err == nil })
			s.waitDrained(60 * time.Second)
			for _, r := range relays {
				if code := r.stop(t, 15*time.Second); code != 0 {
					t.Errorf("exit %d", code)
				}
			}
		})
	}
}

// otherListener writes a copy of the stack's config that listens on
// another address than addr, and returns that address and the copy.
func (s *stack) otherListener(addr string) (string, string) {
	s.t.Helper()
	b, err := os.ReadFile(s.cfgPath)
	if err != nil {
		s.t.Fatal(err)
	}
	other := fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	return other, writeConfig(s.t, strings.Replace(string(b), addr, other, 1))
}

// waitCapture waits at most d until every relay listening on addrs
// answers /readyz 200 and relay_capture_ready 1 (ready), or 503 and 0,
// and reports whether they did; the test fails when they did not.
func waitCapture(t *testing.T, addrs []string, ready bool, d time.Duration) bool {
	t.Helper()
	code, metric := http.StatusOK, "relay_capture_ready 1"
	if !ready {
		code, metric = http.StatusServiceUnavailable, "relay_capture_ready 0"
	}
	start := time.Now()
	for _, addr := range addrs {
		for readyz(addr) != code || !strings.Contains(get(addr, "/metrics"), "\n"+metric+"\n") {
			if time.Since(start) > d {
				t.Errorf("%s: /readyz %d (%q), want %d and %s within %s", addr, readyz(addr),
					strings.TrimSpace(get(addr, "/readyz")), code, metric, d)
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("%d relay(s) ready=%v after %s", len(addrs), ready, time.Since(start).Round(100*time.Millisecond))
	return true
}

// checkOutageLog checks what relay i logged from the stop of Postgres until
// it was ready again: a few warnings, not one per retry, and none about
// the wal capture lock after the first.
func checkOutageLog(t *testing.T, i int, logs string) {
	t.Helper()
	var warnings, lock int
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			warnings++
		}
		if strings.Contains(line, "wal capture lock") && !strings.Contains(line, "works again") {
			lock++
		}
	}
	if warnings > 5 || lock > 2 {
		t.Errorf("relay %d logged %d warnings, %d about the wal capture lock, over a %s outage (want at most 5 and 2):\n%s",
			i, warnings, lock, outageLength, logs)
	}
}

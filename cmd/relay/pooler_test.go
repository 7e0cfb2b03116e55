package main

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestTransactionPooler points postgres.url at a PgBouncer in transaction
// pooling mode, in both capture modes: relay check fails the session check
// and says what to connect to instead, and relay run stops at once with
// exit status 2 and the same words, having taken nothing from the outbox.
// Through a PgBouncer in session mode, poll mode's check passes.
func TestTransactionPooler(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: mode})
			if _, err := s.write(t.Context(), 1, 5); err != nil {
				t.Fatal(err)
			}
			pooled := testenv.StartPgBouncer(t, s.dsn, "transaction")
			rewriteDSN(t, s.cfgPath, s.dsn, pooled)

			out, code := runRelay(t, "check", "--config", s.cfgPath)
			if code != 1 || !strings.Contains(out, "FAIL  postgres session") || !strings.Contains(out, "transaction-pooling proxy") ||
				!strings.Contains(out, "point postgres.url at PostgreSQL itself") {
				t.Fatalf("check through a transaction pooler: exit %d, want 1 and a FAIL naming the pooler and the fix\n%s", code, out)
			}
			p := s.start()
			select {
			case <-p.done:
			case <-time.After(60 * time.Second):
				p.kill()
				t.Fatalf("relay run through a transaction pooler still runs after 60 s\n%s", p.logs.String())
			}
			logs := p.logs.String()
			if code := p.cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(logs, "transaction-pooling proxy") ||
				!strings.Contains(logs, "point postgres.url at PostgreSQL itself") || strings.Contains(logs, "SQLSTATE 42P05") {
				t.Fatalf("relay run through a transaction pooler: exit %d, want 2 and an error naming the pooler and the fix\n%s", code, logs)
			}
			if n := s.outboxRows(); n != 5 {
				t.Fatalf("%d rows left in the outbox after relay run through a transaction pooler, want all 5", n)
			}
			if mode == "wal" {
				return // replication needs a direct connection whatever the pool mode
			}

			session := testenv.StartPgBouncer(t, s.dsn, "session")
			rewriteDSN(t, s.cfgPath, pooled, session)
			if out, code := runRelay(t, "check", "--config", s.cfgPath); code != 0 || !strings.Contains(out, "ok    postgres session") {
				t.Fatalf("check through a session pooler: exit %d, want 0\n%s", code, out)
			}
		})
	}
}

package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// noIndex is the start of the warning about a missing poll index (the
// log quotes the rest).
const noIndex = `outbox table public.outbox has no index on `

// TestMissingPollIndexWarned runs check and run in poll mode on an outbox
// made by hand without an index on seq: both warn once with the statement
// to run; after relay init neither does.
func TestMissingPollIndexWarned(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{NoInit: true})
	fix := `fix: CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS "outbox_relay_seq_idx" ON "public"."outbox" ("seq")`
	out, _ := runRelay(t, "check", "--config", s.cfgPath)
	if strings.Count(out, "WARN  "+noIndex+`"seq"`) != 1 || !strings.Contains(out, fix) {
		t.Errorf("relay check: want one warning %q with %q\n%s", noIndex, fix, out)
	}
	relay := s.start()
	waitFor(t, func() bool { return strings.Contains(relay.logs.String(), "relay running") })
	if logs := relay.logs.String(); strings.Count(logs, noIndex) != 1 || !strings.Contains(logs, "level=WARN") {
		t.Errorf("relay run: want one WARN line %q\n%s", noIndex, logs)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if out, code := runRelay(t, "init", "--config", s.cfgPath); code != 0 {
		t.Fatalf("relay init: exit %d\n%s", code, out)
	}
	if out, _ := runRelay(t, "check", "--config", s.cfgPath); strings.Contains(out, "WARN") {
		t.Errorf("relay check after relay init still warns\n%s", out)
	}
	relay = s.start()
	waitFor(t, func() bool { return strings.Contains(relay.logs.String(), "relay running") })
	if logs := relay.logs.String(); strings.Contains(logs, noIndex) {
		t.Errorf("relay run after relay init still warns\n%s", logs)
	}
}

// TestBloatWarned makes the outbox bloated (120,000 rows deleted with
// autovacuum off for it): relay check warns with VACUUM and the autovacuum
// setting to reset, and stops once the table was vacuumed.
func TestBloatWarned(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	for _, q := range []string{
		`ALTER TABLE outbox SET (autovacuum_enabled = false)`,
		`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), 'order', 'a', 'step', '{}' FROM generate_series(1, 120000)`,
		`DELETE FROM outbox`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s.waitDeadRows(func(n int) bool { return n >= 120000 })
	out, _ := runRelay(t, "check", "--config", s.cfgPath)
	for _, want := range []string{"WARN  outbox table public.outbox is bloated: 120000 dead rows, 0 live",
		`fix: VACUUM (ANALYZE) "public"."outbox"; autovacuum is off for it: ALTER TABLE "public"."outbox" RESET (autovacuum_enabled)`} {
		if !strings.Contains(out, want) {
			t.Errorf("relay check lacks %q\n%s", want, out)
		}
	}
	if _, err := s.pool.Exec(ctx, `VACUUM outbox`); err != nil {
		t.Fatal(err)
	}
	s.waitDeadRows(func(n int) bool { return n == 0 })
	if out, _ := runRelay(t, "check", "--config", s.cfgPath); strings.Contains(out, "WARN") {
		t.Errorf("relay check warns after VACUUM\n%s", out)
	}
}

// waitDeadRows waits until the statistics' dead row count of the outbox
// satisfies ok.
func (s *stack) waitDeadRows(ok func(int) bool) {
	s.t.Helper()
	waitFor(s.t, func() bool {
		var n int
		err := s.pool.QueryRow(context.Background(), `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'outbox'::regclass`).Scan(&n)
		return err == nil && ok(n)
	})
}

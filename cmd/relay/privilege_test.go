package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestLeastPrivilegeMissingObjects runs a role without privileges against
// an outbox the application created by hand: `relay check` prints the
// GRANTs it lacks and names the missing dead-letter table, `relay run`
// refuses to start (exit 1) naming the GRANTs, the table and `relay init`
// instead of failing on DDL, and
// after a superuser's `relay init` and exactly the GRANTs check printed,
// check passes; a wal-mode run then exits 1 naming the missing drain table.
func TestLeastPrivilegeMissingObjects(t *testing.T) {
	t.Parallel()
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, testenv.ContractOutbox); err != nil {
		t.Fatal(err)
	}
	role, roleDSN := newRole(t, pool, dsn)
	config := func(url string) string {
		return writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\narchive:\n  mode: mark\nsink:\n  type: nats\n  nats:\n    url: %s\n", url, n.URL()))
	}
	admin, relay := config(dsn), config(roleDSN)

	out, code := runRelay(t, "check", "--config", relay)
	for _, want := range []string{
		`GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox" TO "` + role + `"`,
		`GRANT SELECT ON SEQUENCE public.outbox_seq_seq TO "` + role + `"`,
		`FAIL  table "public"."outbox_dead_letter": missing`,
		`FAIL  column "published_at" of "public"."outbox": missing`,
	} {
		if code != 1 || !strings.Contains(out, want) {
			t.Fatalf("check as %s: exit %d, want 1 and %q in:\n%s", role, code, want, out)
		}
	}
	out, code = runRelay(t, "run", "--config", relay)
	if code != 1 || !strings.Contains(out, `GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox" TO "`+role+`"`) ||
		!strings.Contains(out, `table "public"."outbox_dead_letter" does not exist: run `+"`relay init`") {
		t.Fatalf("run as %s without grants or a dead-letter table: exit %d, want 1 naming the GRANTs, the table and relay init:\n%s", role, code, out)
	}
	if out, code := runRelay(t, "init", "--config", admin); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	out, code = runRelay(t, "check", "--config", relay)
	grants := regexp.MustCompile(`(?m)^\s+(GRANT .*;)$`).FindAllStringSubmatch(out, -1)
	if code != 1 || len(grants) == 0 {
		t.Fatalf("check after init: exit %d, want 1 with GRANTs:\n%s", code, out)
	}
	for _, g := range grants {
		if _, err := pool.Exec(ctx, g[1]); err != nil {
			t.Fatalf("%s: %v", g[1], err)
		}
	}
	if out, code := runRelay(t, "check", "--config", relay); code != 0 || strings.Contains(out, "FAIL") {
		t.Fatalf("check after the printed GRANTs: exit %d\n%s", code, out)
	}
	// Wal mode after a poll-mode init: the drain table is missing.
	if _, err := pool.Exec(ctx, "ALTER ROLE "+role+" REPLICATION"); err != nil {
		t.Fatal(err)
	}
	walCfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: wal\nsink:\n  type: nats\n  nats:\n    url: %s\n", roleDSN, n.URL()))
	out, code = runRelay(t, "run", "--config", walCfg)
	if code != 1 || !strings.Contains(out, "drain table public.outbox_relay_drain does not exist") || !strings.Contains(out, "relay init") {
		t.Fatalf("wal run as %s without a drain table: exit %d, want 1 naming the table and relay init:\n%s", role, code, out)
	}
}

// TestReplicationPrivilegeByMembership checks that `relay check` accepts
// the replication privilege of a member of a role named rds_replication
// (how Amazon RDS and Aurora grant it), and rejects a role with neither
// that nor the REPLICATION attribute.
func TestReplicationPrivilegeByMembership(t *testing.T) {
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, testenv.ContractOutbox+`;
		DO $$ BEGIN CREATE ROLE rds_replication; EXCEPTION WHEN duplicate_object THEN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	role, roleDSN := newRole(t, conn, dsn)
	cfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: wal\nsink:\n  type: nats\n  nats:\n    url: %s\n", roleDSN, n.URL()))
	out, _ := runRelay(t, "check", "--config", cfg)
	if !strings.Contains(out, "FAIL  replication privilege") || !strings.Contains(out, "GRANT rds_replication TO") {
		t.Fatalf("check as %s without replication: want FAIL naming rds_replication:\n%s", role, out)
	}
	if _, err := conn.Exec(ctx, "GRANT rds_replication TO "+role); err != nil {
		t.Fatal(err)
	}
	if out, _ := runRelay(t, "check", "--config", cfg); !strings.Contains(out, "ok    replication privilege") {
		t.Fatalf("check as a member of rds_replication: want the replication privilege ok:\n%s", out)
	}
}

// TestInitLockTimeout holds an application transaction open on the outbox
// while `relay init` needs a strong lock on it (archive mode mark adds a
// column) or builds an index: inserts of other sessions are never held
// behind init for long, init exits 1 naming the object and the lock, and
// once the transaction ended, init finishes, rebuilding the index its
// interrupted run left INVALID.
func TestInitLockTimeout(t *testing.T) {
	n, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	base := fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: %s\n", dsn, n.URL())
	plain, mark := writeConfig(t, base), writeConfig(t, base+"archive:\n  mode: mark\n")
	if out, code := runRelay(t, "init", "--config", plain); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, out)
	}
	insert := func(ctx context.Context, q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}) error {
		_, err := q.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', 'a', 'e', '{}')`, uuid.NewString())
		return err
	}

	for _, tc := range []struct {
		name, cfg, want, prepare string
	}{
		{name: "alter table", cfg: mark, want: "create column published_at of public.outbox: gave up after lock_timeout"},
		{name: "index", cfg: plain, want: "create index outbox_relay_seq_idx on public.outbox: gave up after lock_timeout",
			prepare: "DROP INDEX outbox_relay_seq_idx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prepare != "" {
				if _, err := pool.Exec(ctx, tc.prepare); err != nil {
					t.Fatal(err)
				}
			}
			app, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer app.Rollback(ctx)
			if err := insert(ctx, app); err != nil {
				t.Fatal(err)
			}
			// Other sessions insert all along; none may wait for the open
			// transaction behind init.
			var slowest atomic.Int64
			stop := make(chan struct{})
			inserted := make(chan error, 1)
			go func() {
				for {
					select {
					case <-stop:
						inserted <- nil
						return
					default:
					}
					begin := time.Now()
					ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
					err := insert(ictx, pool)
					cancel()
					if err != nil {
						inserted <- err
						return
					}
					if d := time.Since(begin); d.Milliseconds() > slowest.Load() {
						slowest.Store(d.Milliseconds())
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
			out, code := runRelay(t, "init", "--config", tc.cfg, "--lock-timeout", "1s")
			close(stop)
			if err := <-inserted; err != nil {
				t.Fatalf("an insert of another session failed or waited 30s behind init: %v", err)
			}
			if code != 1 || !strings.Contains(out, tc.want) || !strings.Contains(out, "the application holds a lock") ||
				!strings.Contains(out, "run `relay init` again") {
				t.Fatalf("init with an open application transaction: exit %d, want 1 and %q:\n%s", code, tc.want, out)
			}
			t.Logf("slowest insert of another session while init waited: %d ms (lock_timeout 1s)", slowest.Load())
			if err := app.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if out, code := runRelay(t, "init", "--config", tc.cfg); code != 0 {
				t.Fatalf("init after the transaction ended: exit %d\n%s", code, out)
			}
			var valid bool
			if err := pool.QueryRow(ctx, `SELECT bool_and(indisvalid) FROM pg_index WHERE indrelid = 'outbox'::regclass`).Scan(&valid); err != nil || !valid {
				t.Fatalf("outbox indexes valid after init: %v (%v)", valid, err)
			}
		})
	}
}

// TestRunRefusesWithoutGrant runs `relay run` as a role holding what `relay
// init --dry-run --role` prints less one privilege that only a later path
// of the relay uses (wal mode's table drain claims rows with SELECT … FOR
// UPDATE; archive mode mark; archive mode partition's truncation of a
// partition; dead-lettering; the claim watermark; the drain bookkeeping): the relay refuses to start with exit 1, naming the
// privilege, the path that needs it and the GRANT to run, instead of
// failing on it in the middle of an incident.
func TestRunRefusesWithoutGrant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, mode, archive, revoke, want, why string
	}{
		{name: "wal outbox update", mode: "wal", revoke: `REVOKE UPDATE ("id") ON public.outbox FROM %s`,
			want: `GRANT UPDATE ("id") ON TABLE "public"."outbox" TO "%s"`, why: "FOR UPDATE SKIP LOCKED"},
		{name: "wal drain table", mode: "wal", revoke: `REVOKE DELETE ON public.outbox_relay_drain FROM %s`,
			want: `GRANT DELETE ON TABLE "public"."outbox_relay_drain" TO "%s"`, why: "drain"},
		{name: "poll sequence", mode: "poll", revoke: `REVOKE SELECT ON SEQUENCE public.outbox_seq_seq FROM %s`,
			want: `GRANT SELECT ON SEQUENCE public.outbox_seq_seq TO "%s"`, why: "watermark"},
		{name: "poll dead-letter insert", mode: "poll", revoke: `REVOKE INSERT ON public.outbox_dead_letter FROM %s`,
			want: `GRANT INSERT ON TABLE "public"."outbox_dead_letter" TO "%s"`, why: "dead-letter"},
		{name: "poll mark", mode: "poll", archive: "mark", revoke: `REVOKE UPDATE ("published_at") ON public.outbox FROM %s`,
			want: `GRANT UPDATE ("published_at") ON TABLE "public"."outbox" TO "%s"`, why: "archive.mode mark"},
		{name: "wal partition truncate", mode: "wal", archive: "partition", revoke: `REVOKE TRUNCATE ON public.outbox_p0 FROM %s`,
			want: `GRANT TRUNCATE ON TABLE "public"."outbox_p0" TO "%s"`, why: "archive.mode partition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: tc.mode, Archive: tc.archive, LeastPrivilege: true})
			if _, err := s.pool.Exec(context.Background(), fmt.Sprintf(tc.revoke, s.role)); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf(tc.want, s.role)
			out, code := runRelay(t, "run", "--config", s.cfgPath)
			if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, tc.why) {
				t.Fatalf("run as %s after %q: exit %d, want 1 with %q and %q:\n%s", s.role, tc.revoke, code, want, tc.why, out)
			}
			out, code = runRelay(t, "check", "--config", s.cfgPath)
			if code != 1 || !strings.Contains(out, want) {
				t.Fatalf("check as %s after %q: exit %d, want 1 with %q:\n%s", s.role, tc.revoke, code, want, out)
			}
		})
	}
}

package embedded

import (
	"context"
	"testing"
	"time"
)

// TestPostgresStandbyFailover builds a synchronous standby, kills the
// primary at once and promotes the standby: every acknowledged commit is
// there and the new primary accepts writes.
func TestPostgresStandbyFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	standby, err := primary.StartStandby(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()
	p := connect(t, primary.DSN("postgres"))
	mustExec(t, p, "CREATE TABLE t (n int)")
	mustExec(t, p, "INSERT INTO t SELECT generate_series(1, 100)")
	if got := queryString(t, p, "SELECT current_setting('synchronous_standby_names')"); got == "" {
		t.Fatal("synchronous_standby_names is empty")
	}
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	s := connect(t, standby.DSN("postgres"))
	mustExec(t, s, "INSERT INTO t VALUES (101)")
	if got := queryString(t, s, "SELECT count(*)::text FROM t"); got != "101" {
		t.Fatalf("rows on the promoted standby: %s, want 101", got)
	}
}

// TestPostgresStandbyByCopy builds a standby of a PostgreSQL 17 primary,
// whose npm binaries lack pg_basebackup, by copying the data directory:
// it streams synchronously through its slot and can be promoted.
func TestPostgresStandbyByCopy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := PostgresBin(17)
	if err != nil {
		t.Fatal(err)
	}
	primary, err := StartPostgres(ctx, PostgresOptions{Bin: bin})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	p := connect(t, primary.DSN("postgres"))
	mustExec(t, p, "CREATE TABLE t (n int)")
	mustExec(t, p, "INSERT INTO t SELECT generate_series(1, 100)")
	standby, err := primary.StartStandby(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()
	if standby.PrimarySlot() == "" {
		t.Fatal("the standby was not built by copying (no primary slot)")
	}
	mustExec(t, p, "INSERT INTO t VALUES (101)")
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	s := connect(t, standby.DSN("postgres"))
	if got := queryString(t, s, "SELECT count(*)::text FROM t"); got != "101" {
		t.Fatalf("rows on the promoted standby: %s, want 101", got)
	}
}

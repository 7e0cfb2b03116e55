package testenv

import (
	"context"
	"fmt"
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

// TestPostgresVersionsStart starts a cluster of every supported major
// version and checks its version and that pgoutput decodes.
func TestPostgresVersionsStart(t *testing.T) {
	for _, major := range PostgresMajors {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			bin, err := PostgresBin(major)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pg, err := StartPostgres(ctx, PostgresOptions{Bin: bin})
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Stop()
			c := connect(t, pg.DSN("postgres"))
			if got := queryString(t, c, "SHOW server_version_num"); got[:2] != fmt.Sprint(major) {
				t.Fatalf("server_version_num %s, want %d", got, major)
			}
			mustExec(t, c, "SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
			mustExec(t, c, "SELECT pg_drop_replication_slot('s')")
		})
	}
}

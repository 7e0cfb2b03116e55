package schema

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestMissingPrivilegesInheritedAndAnyColumn checks MissingPrivileges for a
// wal relay with archive mode mark whose role holds its grants through a
// group role: UPDATE on any column of the outbox (here published_at) meets
// the row locks of SELECT … FOR UPDATE, USAGE on the seq sequence meets its
// SELECT, and only the replication privilege is missing, as an ALTER ROLE;
// without UPDATE on any column both UPDATEs are missing and granted in one
// statement.
func TestMissingPrivilegesInheritedAndAnyColumn(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	group, member := fmt.Sprintf("relay_grp_%d", time.Now().UnixNano()), fmt.Sprintf("relay_mem_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE TABLE outbox (id uuid, seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz);
		CREATE TABLE outbox_dead_letter (id uuid);
		CREATE TABLE outbox_relay_drain (slot text);
		CREATE ROLE %[1]s NOLOGIN; CREATE ROLE %[2]s NOLOGIN INHERIT IN ROLE %[1]s;
		GRANT USAGE ON SCHEMA public TO %[1]s;
		GRANT SELECT, DELETE, UPDATE (published_at) ON outbox TO %[1]s;
		GRANT USAGE ON SEQUENCE outbox_seq_seq TO %[1]s;
		GRANT SELECT, INSERT, DELETE ON outbox_dead_letter TO %[1]s;
		GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay_drain TO %[1]s`, group, member)); err != nil {
		t.Fatal(err)
	}
	l := Layout{Outbox: table.ParseName("public.outbox"), DeadLetter: table.ParseName("public.outbox_dead_letter"),
		Cols: Columns{ID: "id", Seq: "seq"}}
	needs := l.RunPrivileges(RunNeeds{WAL: true, ArchiveMode: ArchiveMark, Sequence: "public.outbox_seq_seq"})
	missingAs := func() []string {
		t.Helper()
		if _, err := conn.Exec(ctx, "SET ROLE "+member); err != nil {
			t.Fatal(err)
		}
		defer conn.Exec(ctx, "RESET ROLE")
		missing, absent, err := MissingPrivileges(ctx, conn, needs)
		if err != nil || len(absent) > 0 {
			t.Fatalf("MissingPrivileges: absent %v, err %v", absent, err)
		}
		return GrantSQL(missing, member)
	}
	want := []string{`ALTER ROLE "` + member + `" WITH REPLICATION`}
	if got := missingAs(); !slices.Equal(got, want) {
		t.Fatalf("missing with inherited grants: %q, want %q", got, want)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`REVOKE UPDATE (published_at) ON outbox FROM %s; ALTER ROLE %s REPLICATION`, group, member)); err != nil {
		t.Fatal(err)
	}
	want = []string{`GRANT UPDATE ("id", "published_at") ON TABLE "public"."outbox" TO "` + member + `"`}
	if got := missingAs(); !slices.Equal(got, want) {
		t.Fatalf("missing without UPDATE on the outbox: %q, want %q", got, want)
	}
}

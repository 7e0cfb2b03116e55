package schema

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestStepsAndGrantsQuoteNames runs every init step for tables and
// columns with hostile names (creating each object, then again as a
// no-op), grants a new role what relay run needs with the statements
// GrantSQL prints, and checks as that role that MissingPrivileges finds
// nothing missing, and that it reports the grants of a role without them.
func TestStepsAndGrantsQuoteNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := testenv.NewDB(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	l := Layout{
		Outbox: Table{Schema: "public", Name: hostile},
		Cols: Columns{ID: "id" + hostile, AggregateType: "t" + hostile, AggregateID: "a" + hostile,
			EventType: "e" + hostile, Payload: "p" + hostile, Headers: "h" + hostile,
			CreatedAt: "c" + hostile, Seq: "s" + hostile},
		DeadLetter: Table{Schema: "public", Name: "dl" + hostile},
		Archive:    Table{Schema: "public", Name: "ar" + hostile},
	}
	steps := append(l.InitSteps(true, ArchiveMark, nil), l.archiveSteps(ArchiveMove, nil)...)
	steps = append(steps, l.DrainTableStep())
	for round := range 2 {
		for _, s := range steps {
			var missing bool
			if err := conn.QueryRow(ctx, s.Probe).Scan(&missing); err != nil {
				t.Fatalf("probe %s: %v", s.Object, err)
			}
			if missing != (round == 0 && !s.Drop) { // no index of an earlier release to drop
				t.Fatalf("round %d: %s missing = %v", round, s.Object, missing)
			}
			if err := s.Run(ctx, conn); err != nil {
				t.Fatal(err)
			}
		}
	}
	info, err := Inspect(ctx, conn, l)
	if err != nil {
		t.Fatal(err)
	}
	privs := l.RunPrivileges(RunNeeds{WAL: true, ArchiveMode: ArchiveMove, Prune: true, Sequence: info.SeqSequence})
	privs = append(privs, l.RunPrivileges(RunNeeds{ArchiveMode: ArchiveMark, Sequence: info.SeqSequence})...)
	role := fmt.Sprintf("relay_grants_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE ROLE "+role); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET ROLE "+role); err != nil {
		t.Fatal(err)
	}
	missing, absent, err := MissingPrivileges(ctx, conn, privs)
	if err != nil || len(absent) > 0 || len(missing) == 0 {
		t.Fatalf("without grants: missing %d, absent %v, %v", len(missing), absent, err)
	}
	if _, err := conn.Exec(ctx, "RESET ROLE"); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range GrantSQL(privs, role) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatalf("%v\n%s", err, stmt)
		}
	}
	if _, err := conn.Exec(ctx, "SET ROLE "+role); err != nil {
		t.Fatal(err)
	}
	missing, absent, err = MissingPrivileges(ctx, conn, privs)
	if err != nil || len(absent) > 0 || len(missing) > 0 {
		t.Fatalf("after GrantSQL: missing %v, absent %v, %v", fmt.Sprint(GrantSQL(missing, role)), absent, err)
	}
}

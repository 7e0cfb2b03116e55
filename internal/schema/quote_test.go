package schema

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// hostile is a name with every character that ends a quoted identifier, a
// string literal or a dollar-quoted body, 61 bytes long, so that every name
// derived from it overflows 63 bytes with a multibyte character at the cut.
const hostile = `o$fn$'x"\y; DROP TABLE z --` + "ééééééééééééééééé"

// TestGeneratedSQLQuotesNames runs the DDL and the statements poll mode
// (notify trigger) and wal mode (drain table, slot, FillDrain) generate for
// tables and columns with hostile names, with standard_conforming_strings
// on and off: each must run, and the trigger must notify the channel the
// poller listens on.
func TestGeneratedSQLQuotesNames(t *testing.T) {
	for _, scs := range []string{"on", "off"} {
		t.Run("standard_conforming_strings="+scs, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgx.Connect(ctx, testenv.NewDB(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+scs); err != nil {
				t.Fatal(err)
			}
			l := Layout{
				Outbox: Table{Schema: "public", Name: hostile},
				Cols: Columns{ID: "id" + hostile, AggregateType: "t" + hostile, AggregateID: "a" + hostile,
					EventType: "e" + hostile, Payload: "p" + hostile, Headers: "h" + hostile,
					CreatedAt: "c" + hostile, Seq: "s" + hostile},
				DeadLetter: Table{Schema: "public", Name: "dl" + hostile},
				Archive:    Table{Schema: "public", Name: "ar" + hostile},
			}
			slot := "quote_" + scs
			stmts := []string{l.CreateOutbox(), l.CreatePollIndex()}
			stmts = append(stmts, l.CreateNotifyTrigger()...)
			stmts = append(stmts, l.CreateDeadLetter(nil)...)
			stmts = append(stmts, l.ArchiveDDL("move", nil)...)
			stmts = append(stmts, l.CreateDrainTable())
			stmts = append(stmts, l.CreateSlot(slot, false).List()...)
			for _, stmt := range stmts {
				if _, err := conn.Exec(ctx, stmt); err != nil {
					t.Fatalf("%v\n%s", err, stmt)
				}
			}
			if _, err := conn.Exec(ctx, "LISTEN "+Q(l.NotifyChannel())); err != nil {
				t.Fatal(err)
			}
			c := l.Cols
			if _, err := conn.Exec(ctx, "INSERT INTO "+l.Outbox.Ident()+" ("+l.insertColumns()+") VALUES ($1, 't', 'a', 'e', '{}', NULL, now())",
				uuid.New()); err != nil {
				t.Fatal(err)
			}
			n, err := conn.WaitForNotification(ctx)
			if err != nil || n.Channel != l.NotifyChannel() {
				t.Fatalf("notification %+v, %v; want channel %q", n, err, l.NotifyChannel())
			}
			var drainTo int64
			if err := conn.QueryRow(ctx, `SELECT drain_to FROM `+l.DrainTable().Ident()+` WHERE slot = $1`, slot).Scan(&drainTo); err != nil || drainTo != 0 {
				t.Fatalf("drain_to %d, %v; want 0 (no row before the slot)", drainTo, err)
			}
			if _, err := conn.Exec(ctx, `UPDATE `+l.DrainTable().Ident()+` SET drain_to = NULL`); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, l.FillDrain(slot)).Scan(&drainTo); err != nil || drainTo != 1 {
				t.Fatalf("FillDrain: %d, %v; want 1 (%s)", drainTo, err, c.Seq)
			}
			for _, stmt := range l.DropNotifyTrigger() {
				if _, err := conn.Exec(ctx, stmt); err != nil {
					t.Fatalf("%v\n%s", err, stmt)
				}
			}
			if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDerivedNames checks that names derived from a long table name keep
// their suffix, stay within 63 bytes, never cut a character and differ
// between tables that differ only past the cut.
func TestDerivedNames(t *testing.T) {
	long := strings.Repeat("é", 40)
	a, b := derived(long+"a", "_relay_drain"), derived(long+"b", "_relay_drain")
	if a == b || len(a) > maxName || !strings.HasSuffix(a, "_relay_drain") || !utf8.ValidString(a) {
		t.Errorf("derived names %q and %q", a, b)
	}
	if got := derived("outbox", "_relay_drain"); got != "outbox_relay_drain" {
		t.Errorf("short name changed: %q", got)
	}
}

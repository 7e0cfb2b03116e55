package schema

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestLackingOutbox inspects Debezium's outbox table, which lacks headers,
// created_at and seq: poll's inspection names the ALTER TABLE, wal's lists
// them in Missing; the init steps build no index on seq and create the
// dead-letter table with all eight columns; and the drain bound of a new
// slot is 1 while the table holds rows, 0 once it is empty.
func TestLackingOutbox(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l := Layout(table.DefaultLayout())
	l.Cols.AggregateType, l.Cols.AggregateID, l.Cols.EventType = "aggregatetype", "aggregateid", "type"
	for _, stmt := range []string{`CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)`, l.CreateDrainTable()} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := InspectFor(ctx, conn, l, false); err == nil || !strings.Contains(err.Error(), `ADD COLUMN "headers" jsonb`) {
		t.Errorf("poll inspection: %v, want the ALTER TABLE adding headers", err)
	}
	info, err := InspectSource(ctx, conn, l, true)
	if err != nil || !slices.Equal(info.Missing, []string{"headers", "created_at", "seq"}) {
		t.Fatalf("wal inspection: missing %v, %v", info.Missing, err)
	}
	for _, s := range l.InitSteps(false, ArchiveDelete, info.Types) {
		if strings.Contains(s.Object, "relay_seq_idx") {
			t.Errorf("init step %s on an outbox without seq", s.Object)
		}
		if err := s.Run(ctx, conn); err != nil {
			t.Fatalf("init step %s: %v", s.Object, err)
		}
	}
	var cols int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'outbox_dead_letter'::regclass
		AND attname = ANY('{headers,created_at,seq}') AND NOT attisdropped`).Scan(&cols); err != nil || cols != 3 {
		t.Errorf("dead-letter table has %d of headers, created_at and seq (%v)", cols, err)
	}
	for _, want := range []int64{1, 0} {
		if want == 0 {
			if _, err := conn.Exec(ctx, `DELETE FROM outbox`); err != nil {
				t.Fatal(err)
			}
		} else if _, err := conn.Exec(ctx, `INSERT INTO outbox VALUES (gen_random_uuid(), 'a', '1', 't', '{}')`); err != nil {
			t.Fatal(err)
		}
		c := l.CreateSlot("s", false)
		var to int64
		if _, err := conn.Exec(ctx, c.RecordDrain); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, c.FillDrain).Scan(&to); err != nil || to != want {
			t.Errorf("drain bound %d (%v), want %d", to, err, want)
		}
	}
}

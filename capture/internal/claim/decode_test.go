package claim

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestDecodeAsPgx reads rows with every payload type, created_at values
// around the epochs, at the ends of the range and infinite, and NULLs, and
// checks that decode gives what pgx gives for each row it takes, that it
// takes the usual ones, and that payload copies do not share capacity. The
// first row of the text, varchar and bytea tables has an empty payload.
func TestDecodeAsPgx(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	created := []string{"now()", "'1969-07-20 20:17:40.123456+00'", "'1999-12-31 23:59:59.999999+00'", "'2000-01-01 00:00:00+00'",
		"'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'", "'0500-06-01 12:00:00+00'", "'infinity'", "'-infinity'", "NULL"}
	for _, typ := range []string{"jsonb", "json", "text", "varchar", "bytea"} {
		t.Run(typ, func(t *testing.T) {
			table := "decode_" + typ
			mustExecIn(t, conn, fmt.Sprintf(`CREATE TABLE %s (id text, aggregate_type text, aggregate_id text, event_type text,
				payload %s, headers jsonb, created_at timestamptz, seq bigint)`, table, typ))
			payloads := []string{`'{"a": [1, 2]}'`, `'{}'`, "NULL"}
			if typ == "text" || typ == "varchar" || typ == "bytea" {
				payloads = append([]string{"''"}, payloads...) // the scanner's first payload is empty
			}
			seq := int64(-2)
			for _, c := range created {
				for _, p := range payloads {
					seq += 7
					mustExecIn(t, conn, fmt.Sprintf(`INSERT INTO %s VALUES ('i', 't', 'a', 'e', %s, NULL, %s, %d)`, table, p, c, seq))
				}
			}
			rows, err := conn.Query(ctx, "SELECT * FROM "+table+" ORDER BY seq")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			sc := newScanner(rows)
			if !sc.raw {
				t.Fatalf("%s payloads are not decoded from raw values", typ)
			}
			var prev *event.Event
			taken := 0
			for rows.Next() {
				fast := sc.newEvent()
				ok := sc.decode(fast, rows.RawValues())
				sc.payload = nil
				if err := rows.Scan(sc.dest...); err != nil {
					t.Fatal(err)
				}
				if !ok {
					if sc.created.Valid && sc.created.InfinityModifier == 0 && sc.created.Time.Year() >= 1 && sc.created.Time.Year() <= 9999 {
						t.Errorf("seq %d (created %v) left to pgx", sc.seq, sc.created.Time)
					}
					continue
				}
				taken++
				var at = sc.created.Time
				if !sc.created.Valid {
					at = fast.CreatedAt // both zero
				}
				if !fast.CreatedAt.Equal(at) || fast.CreatedAt.Location() != at.Location() || int64(fast.Position) != sc.seq ||
					!bytes.Equal(fast.Payload, sc.payload) || (fast.Payload == nil) != (sc.payload == nil) {
					t.Errorf("seq %d: decoded %v %d %q (nil %v), pgx %v %d %q (nil %v)", sc.seq, fast.CreatedAt, fast.Position, fast.Payload,
						fast.Payload == nil, sc.created.Time, sc.seq, sc.payload, sc.payload == nil)
				}
				if prev != nil && len(prev.Payload) > 0 && len(fast.Payload) > 0 {
					before := string(fast.Payload)
					_ = append(prev.Payload, 'x')
					if string(fast.Payload) != before {
						t.Errorf("seq %d: appending to the previous payload changed this one", sc.seq)
					}
				}
				prev = fast
			}
			if rows.Err() != nil {
				t.Fatal(rows.Err())
			}
			if taken < len(payloads)*7 {
				t.Errorf("decoded %d rows", taken)
			}
		})
	}
}

func mustExecIn(t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// debeziumTable is the outbox table of Debezium's outbox event router
// documentation ("Basic outbox table").
const debeziumTable = `CREATE TABLE outboxevent (
  id            uuid NOT NULL PRIMARY KEY,
  aggregatetype character varying(255) NOT NULL,
  aggregateid   character varying(255) NOT NULL,
  type          character varying(255) NOT NULL,
  payload       jsonb
)`

// debeziumColumns adds the three columns poll capture needs, as
// docs/migrating-from-debezium.md does.
const debeziumColumns = `ALTER TABLE outboxevent
  ADD COLUMN headers jsonb,
  ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY`

// debeziumRecord is what a consumer written for the router's messages
// reads of a Kafka record.
type debeziumRecord struct {
	topic, key, id string
	headers        map[string]string
	value          []byte
}

// TestDebeziumFormat runs the relay with sink.format: debezium on an
// outbox table with Debezium's column names, in both capture modes, and
// reads Kafka as a consumer of Debezium's outbox event router does: topic
// outbox.event.<aggregatetype>, the key the aggregate id as a JSON string,
// the event id in the id header, the value the payload as a JSON string
// (or, expanded, the JSON document in an envelope with the placed
// aggregatetype), and the event type in the eventType header. The records
// are read with franz-go and, in poll mode, also with kcat. In poll mode,
// before the relay's three columns are added, relay init fails saying how
// to add them; wal mode runs on the table as it is.
func TestDebeziumFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode, debezium string
		expand         bool
	}{
		{"poll", "    additional_placement: [\"type:header:eventType\"]\n", false},
		{"wal", "    additional_placement: [\"type:header:eventType,aggregatetype:envelope:aggregateType\"]\n    expand_json_payload: true\n", true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			c, err := kafkatest.Start(kafkatest.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			dsn := testenv.NewDB(t)
			pool, err := pgxpool.New(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if _, err := pool.Exec(context.Background(), debeziumTable); err != nil {
				t.Fatal(err)
			}
			cfg := writeConfig(t, fmt.Sprintf(`postgres:
  url: %s
outbox:
  table: outboxevent
  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type}
capture:
  mode: %s
  poll:
    interval: 50ms
  wal:
    slot: relay_test_%d
sink:
  type: kafka
  format: debezium
  debezium:
%s  kafka:
    brokers: [%s]
`, dsn, tc.mode, slotCounter.Add(1), tc.debezium, c.Addrs()[0]))
			if tc.mode == "poll" {
				want := `outbox table public.outboxevent has no column "headers": add it (ALTER TABLE "public"."outboxevent" ADD COLUMN "headers" jsonb;`
				if out, code := runRelay(t, "init", "--config", cfg); code != 1 || !strings.Contains(out, want) {
					t.Errorf("relay init without the relay's columns: exit %d, want 1 with %q:\n%s", code, want, out)
				}
				if _, err := pool.Exec(context.Background(), debeziumColumns); err != nil {
					t.Fatal(err)
				}
			}
			if out, code := runRelay(t, "init", "--config", cfg); code != 0 {
				t.Fatalf("relay init: exit %d\n%s", code, out)
			}
			relay := startProc(t, context.Background(), "run", "--config", cfg)
			const n = 20
			ids := make([]string, n)
			for i := range n {
				// Debezium's example payload, one aggregate per five events.
				err := pool.QueryRow(context.Background(), `INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
					VALUES (gen_random_uuid(), $1, $2, 'OrderCreated', jsonb_build_object('id', $3::int, 'lineItems',
					'[{"id": 1, "item": "Debezium in Action", "quantity": 2, "totalPrice": 39.98}]'::jsonb, 'customerId', 123)) RETURNING id::text`,
					[]string{"order", "customer"}[i%2], fmt.Sprint(i%4), i).Scan(&ids[i])
				if err != nil {
					t.Fatal(err)
				}
			}
			recs := waitDebezium(t, c, n)
			if code := relay.stop(t, 30*time.Second); code != 0 {
				t.Errorf("relay run: exit %d", code)
			}
			checkDebezium(t, recs, ids, tc.expand)
			if tc.mode == "poll" {
				checkDebezium(t, kcatRecords(t, c.Addrs()[0], n), ids, tc.expand)
			}
		})
	}
}

// waitDebezium reads the records of the outbox.event. topics with franz-go
// until there are n.
func waitDebezium(t *testing.T, c *kafkatest.Cluster, n int) []debeziumRecord {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		recs, err := c.Records(ctx, "outbox.event.")
		cancel()
		if err == nil && len(recs) >= n || time.Now().After(deadline) {
			var out []debeziumRecord
			for _, r := range recs {
				d := debeziumRecord{topic: r.Topic, key: string(r.Key), value: r.Value, headers: map[string]string{}}
				for _, h := range r.Headers {
					d.headers[h.Key] = string(h.Value)
				}
				out = append(out, d)
			}
			return out
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// kcatRecords reads the records of both topics with kcat (Debian's kcat
// package), as JSON envelopes.
func kcatRecords(t *testing.T, broker string, n int) []debeziumRecord {
	t.Helper()
	var out []debeziumRecord
	for _, topic := range []string{"outbox.event.order", "outbox.event.customer"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b, err := exec.CommandContext(ctx, "kcat", "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q", "-J").Output()
		cancel()
		if err != nil {
			t.Fatalf("kcat: %v", err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var m struct {
				Topic   string   `json:"topic"`
				Key     string   `json:"key"`
				Payload string   `json:"payload"`
				Headers []string `json:"headers"`
			}
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("kcat line %q: %v", line, err)
			}
			d := debeziumRecord{topic: m.Topic, key: m.Key, value: []byte(m.Payload), headers: map[string]string{}}
			for i := 0; i+1 < len(m.Headers); i += 2 {
				d.headers[m.Headers[i]] = m.Headers[i+1]
			}
			out = append(out, d)
		}
	}
	if len(out) != n {
		t.Errorf("kcat read %d records, want %d", len(out), n)
	}
	return out
}

// checkDebezium decodes recs as a consumer of the router's messages does
// and checks each event arrived once, as written, in its aggregate's
// order.
func checkDebezium(t *testing.T, recs []debeziumRecord, ids []string, expand bool) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{} // the last event of each topic and key
	for _, r := range recs {
		var key string
		if err := json.Unmarshal([]byte(r.key), &key); err != nil {
			t.Errorf("key %q is not a JSON string: %v", r.key, err)
		}
		i := slices.Index(ids, r.headers["id"])
		if i < 0 || seen[r.headers["id"]] {
			t.Errorf("id header %q: unknown or seen twice", r.headers["id"])
			continue
		}
		seen[r.headers["id"]] = true
		aggType := []string{"order", "customer"}[i%2]
		if prev, ok := last[r.topic+r.key]; ok && prev > i {
			t.Errorf("event %d after event %d of its aggregate", i, prev)
		}
		last[r.topic+r.key] = i
		if r.topic != "outbox.event."+aggType || key != fmt.Sprint(i%4) || r.headers["eventType"] != "OrderCreated" {
			t.Errorf("event %d: topic %s, key %q, eventType %q", i, r.topic, key, r.headers["eventType"])
		}
		var payload struct {
			ID        int `json:"id"`
			LineItems []struct {
				Item       string  `json:"item"`
				TotalPrice float64 `json:"totalPrice"`
			} `json:"lineItems"`
			CustomerID int `json:"customerId"`
		}
		if expand {
			var env struct {
				Payload       json.RawMessage `json:"payload"`
				AggregateType string          `json:"aggregateType"`
			}
			if err := json.Unmarshal(r.value, &env); err != nil || env.AggregateType != aggType {
				t.Errorf("event %d: envelope %s: %v", i, r.value, err)
			}
			if err := json.Unmarshal(env.Payload, &payload); err != nil {
				t.Errorf("event %d: payload %s: %v", i, env.Payload, err)
			}
		} else {
			var s string
			if err := json.Unmarshal(r.value, &s); err != nil {
				t.Errorf("event %d: value %s is not a JSON string: %v", i, r.value, err)
			}
			if err := json.Unmarshal([]byte(s), &payload); err != nil {
				t.Errorf("event %d: payload %s: %v", i, s, err)
			}
		}
		if payload.ID != i || payload.CustomerID != 123 || len(payload.LineItems) != 1 ||
			payload.LineItems[0].Item != "Debezium in Action" || payload.LineItems[0].TotalPrice != 39.98 {
			t.Errorf("event %d: payload %+v", i, payload)
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%d of %d events read", len(seen), len(ids))
	}
}

// TestDebeziumTable runs wal capture on Debezium's outbox table as it is
// (no seq, headers or created_at), mapped with outbox.columns: rows
// written before relay init are drained from the table, the relay is
// killed with SIGKILL mid-run and restarted, and a row with a NULL payload
// goes to the dead-letter table. Every event arrives, in its aggregate's
// order (a kill may publish some twice), and relay init leaves the outbox
// as it was. In "deleted" the application deletes each row in the
// transaction that inserts it, as Debezium's documentation suggests, so
// only the WAL holds the events.
func TestDebeziumTable(t *testing.T) {
	t.Parallel()
	for _, deleted := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "deleted"}[deleted], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c, err := kafkatest.Start(kafkatest.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			dsn := testenv.NewDB(t)
			pool, err := pgxpool.New(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if _, err := pool.Exec(ctx, debeziumTable); err != nil {
				t.Fatal(err)
			}
			cfg := writeConfig(t, fmt.Sprintf(`postgres:
  url: %s
outbox:
  table: outboxevent
  columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type}
dead_letter:
  table: outboxevent_dead_letter
capture:
  mode: wal
  wal:
    slot: relay_test_%d
sink:
  type: kafka
  format: debezium
  debezium:
    additional_placement: ["type:header:eventType"]
  kafka:
    brokers: [%s]
`, dsn, slotCounter.Add(1), c.Addrs()[0]))
			var ids []string
			write := func(payload string) string {
				t.Helper()
				i := len(ids)
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				var id string
				err = tx.QueryRow(ctx, `INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
					VALUES (gen_random_uuid(), $1, $2, 'OrderCreated', `+payload+`) RETURNING id::text`,
					[]string{"order", "customer"}[i%2], fmt.Sprint(i%4), i).Scan(&id)
				if err == nil && deleted {
					_, err = tx.Exec(ctx, `DELETE FROM outboxevent WHERE id = $1`, id)
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			const event = `jsonb_build_object('id', $3::int, 'lineItems',
				'[{"id": 1, "item": "Debezium in Action", "quantity": 2, "totalPrice": 39.98}]'::jsonb, 'customerId', 123)`
			batch := func(n int) {
				for range n {
					ids = append(ids, write(event))
				}
			}
			if !deleted {
				batch(10) // before the slot exists: drained from the table
			}
			if out, code := runRelay(t, "init", "--config", cfg); code != 0 {
				t.Fatalf("relay init: exit %d\n%s", code, out)
			}
			if deleted {
				batch(10) // the WAL before the slot is not decoded: rows deleted then are gone
			}
			var cols int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
				WHERE attrelid = 'outboxevent'::regclass AND attnum > 0 AND NOT attisdropped`).Scan(&cols); err != nil || cols != 5 {
				t.Fatalf("the outbox has %d columns after relay init, want 5 (%v)", cols, err)
			}
			relay := startProc(t, ctx, "run", "--config", cfg)
			batch(90)
			waitDebezium(t, c, 30)
			if !deleted { // the drain logs its end after its last publish
				waitFor(t, func() bool { return strings.Contains(relay.logs.String(), "outbox backlog published") })
			}
			relay.kill()
			if drained := strings.Contains(relay.logs.String(), "outbox backlog published"); drained == deleted {
				t.Errorf("drained the table before streaming: %v, want %v\n%s", drained, !deleted, relay.logs.String())
			}
			batch(100)
			relay = startProc(t, ctx, "run", "--config", cfg)
			poison := write(`CASE WHEN $3::int < 0 THEN '{}'::jsonb END`) // a NULL payload
			batch(10)
			all := waitDebeziumIDs(t, c, ids)
			recs := firstCopies(all)
			t.Logf("%d events, %d records after a kill -9", len(ids), len(all))
			if code := relay.stop(t, 30*time.Second); code != 0 {
				t.Errorf("relay run: exit %d\n%s", code, relay.logs.String())
			}
			checkDebezium(t, recs, ids, false)
			var dead, msg string
			if err := pool.QueryRow(ctx, `SELECT id::text, error FROM outboxevent_dead_letter`).Scan(&dead, &msg); err != nil || dead != poison {
				t.Errorf("dead-letter table: %s %q (%v), want %s", dead, msg, err, poison)
			}
			var left int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM outboxevent`).Scan(&left); err != nil || left != 0 {
				t.Errorf("%d rows left in the outbox (%v), want 0", left, err)
			}
			if !deleted { // the dead letter goes back into the outbox without the columns it lacks
				if out, code := runRelay(t, "dlq", "redrive", "--id", poison, "--config", cfg); code != 0 {
					t.Errorf("relay dlq redrive: exit %d\n%s", code, out)
				}
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM outboxevent WHERE id = $1`, poison).Scan(&left); err != nil || left != 1 {
					t.Errorf("redriven row in the outbox: %d (%v), want 1", left, err)
				}
			}
			if out, code := runRelay(t, "check", "--config", cfg); code != 0 {
				t.Errorf("relay check: exit %d, want 0\n%s", code, out)
			}
			yaml, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			poll := writeConfig(t, strings.Replace(string(yaml), "mode: wal", "mode: poll", 1))
			want := `ALTER TABLE "public"."outboxevent" ADD COLUMN "headers" jsonb;`
			if out, code := runRelay(t, "check", "--config", poll); code != 1 || !strings.Contains(out, want) {
				t.Errorf("relay check in poll mode: exit %d, want 1 with %q\n%s", code, want, out)
			}
		})
	}
}

// waitDebeziumIDs reads the records of the outbox.event. topics until
// every id of ids arrived, or a minute passed.
func waitDebeziumIDs(t *testing.T, c *kafkatest.Cluster, ids []string) []debeziumRecord {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		recs := waitDebezium(t, c, len(ids))
		if len(firstCopies(recs)) >= len(ids) || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// firstCopies returns recs without the records of an id seen before.
func firstCopies(recs []debeziumRecord) []debeziumRecord {
	seen := map[string]bool{}
	var out []debeziumRecord
	for _, r := range recs {
		if !seen[r.headers["id"]] {
			seen[r.headers["id"]] = true
			out = append(out, r)
		}
	}
	return out
}

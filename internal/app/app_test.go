package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

const minimalYAML = `postgres:
  url: postgres://app@localhost/app
sink:
  type: nats
capture:
  mode: poll
`

func parse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestLayoutOf checks that the layout takes the tables and the remapped
// columns from the config, and the contract names for the others.
func TestLayoutOf(t *testing.T) {
	cfg := parse(t, minimalYAML+`outbox:
  table: events.my_outbox
  columns:
    id: event_id
    seq: position
dead_letter:
  table: dl
archive:
  mode: move
  table: events.done
`)
	l := layoutOf(cfg)
	want := schema.Layout{
		Outbox: schema.Table{Schema: "events", Name: "my_outbox"},
		Cols: schema.Columns{ID: "event_id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
			EventType: "event_type", Payload: "payload", Headers: "headers", CreatedAt: "created_at", Seq: "position"},
		DeadLetter: schema.Table{Schema: "public", Name: "dl"},
		Archive:    schema.Table{Schema: "events", Name: "done"},
	}
	if l != want {
		t.Errorf("layout\n got %+v\nwant %+v", l, want)
	}
}

// TestBudget checks how postgres.max_conns is split per capture mode, and
// that a value leaving no pooled connection is a usage error naming the key.
func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		dedicated int
	}{{"poll", poll.DedicatedConns}, {"wal", wal.DedicatedConns}} {
		cfg := parse(t, minimalYAML)
		cfg.Capture.Mode = tc.mode
		cfg.Postgres.MaxConns = tc.dedicated + 3
		b, err := budget(cfg)
		if err != nil || b.total != tc.dedicated+3 || b.pooled != 3 {
			t.Errorf("%s, max_conns %d: %+v, %v; want 3 pooled", tc.mode, tc.dedicated+3, b, err)
		}
		cfg.Postgres.MaxConns = tc.dedicated
		_, err = budget(cfg)
		if !IsUsage(err) || !strings.Contains(fmt.Sprint(err), "postgres.max_conns") ||
			!strings.Contains(fmt.Sprint(err), fmt.Sprintf("at least %d", tc.dedicated+1)) {
			t.Errorf("%s, max_conns %d: %v; want a usage error asking for at least %d", tc.mode, tc.dedicated, err, tc.dedicated+1)
		}
	}
}

// TestIsUsage checks which errors map to exit status 2: usage and config
// errors, also wrapped, and nothing else.
func TestIsUsage(t *testing.T) {
	_, cfgErr := config.Parse([]byte("postgres: [\n"), func(string) (string, bool) { return "", false })
	if cfgErr == nil {
		t.Fatal("a broken config parsed")
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&UsageError{Err: errors.New("bad flag")}, true},
		{fmt.Errorf("run: %w", &UsageError{Err: errors.New("bad flag")}), true},
		{fmt.Errorf("load: %w", cfgErr), true},
		{errors.New("connection refused"), false},
		{nil, false},
	} {
		if got := IsUsage(tc.err); got != tc.want {
			t.Errorf("IsUsage(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestNewLogger checks log.format and log.level, and that credentials in
// attributes are masked.
func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(config.Log{Format: "json", Level: "warn"}, &buf)
	log.Info("hidden")
	log.Warn("shown", "url", "postgres://app:s3cret@db/app", "password", "hunter2")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v\n%s", err, buf.String())
	}
	if line["msg"] != "shown" || line["level"] != "WARN" {
		t.Errorf("logged %s, want only the warning", buf.String())
	}
	if strings.Contains(buf.String(), "s3cret") || strings.Contains(buf.String(), "hunter2") {
		t.Errorf("a secret was logged: %s", buf.String())
	}
	buf.Reset()
	NewLogger(config.Log{Format: "text", Level: "debug"}, &buf).Debug("detail", "k", "v")
	if got := buf.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "msg=detail k=v") {
		t.Errorf("text logger wrote %q", got)
	}
}

// TestGuardFix checks the fix the database guard names for each lasting
// failure: the exact GRANT for the relay's own tables, sequence and
// schema, and the right command otherwise.
func TestGuardFix(t *testing.T) {
	denied := func(what string) error {
		return fmt.Errorf("claim: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for " + what})
	}
	for _, tc := range []struct {
		archive, capture string
		err              error
		want             string
	}{
		{"delete", "poll", denied("table outbox"), `GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox" TO "relay"`},
		{"mark", "poll", denied("table outbox"), `GRANT SELECT, DELETE, UPDATE ("id", "published_at") ON TABLE "public"."outbox" TO "relay"`},
		{"delete", "wal", denied("table outbox"), `GRANT SELECT, DELETE, UPDATE ("id") ON TABLE "public"."outbox" TO "relay"`},
		{"delete", "poll", denied("table outbox_dead_letter"), `GRANT SELECT, INSERT, DELETE ON TABLE "public"."outbox_dead_letter" TO "relay"`},
		{"move", "poll", denied("table outbox_archive"), `GRANT INSERT ON TABLE "public"."outbox_archive" TO "relay"`},
		{"delete", "wal", denied("table outbox_relay_drain"), `GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "public"."outbox_relay_drain" TO "relay"`},
		{"delete", "poll", denied("table other"), "grant what `relay check` lists to relay"},
		{"delete", "poll", denied("sequence outbox_seq_seq"), `GRANT SELECT ON SEQUENCE "outbox_seq_seq" TO "relay"`},
		{"delete", "poll", denied("schema events"), `GRANT USAGE ON SCHEMA "events" TO "relay"`},
		{"delete", "poll", &pgconn.PgError{Code: "28P01"}, "check the user and password of postgres.url"},
		{"delete", "poll", &pgconn.PgError{Code: "42P01"}, "run `relay init` to create what is missing, or fix outbox.table / outbox.columns"},
		{"delete", "poll", errors.New("not from postgres"), "run `relay check`"},
	} {
		cfg := parse(t, minimalYAML)
		cfg.Archive.Mode, cfg.Capture.Mode = tc.archive, tc.capture
		g := &dbFailures{layout: layoutOf(cfg), cfg: cfg, role: "relay"}
		if got := g.fix(tc.err); got != tc.want {
			t.Errorf("archive %s, %s capture, %v:\n got %s\nwant %s", tc.archive, tc.capture, tc.err, got, tc.want)
		}
	}
}

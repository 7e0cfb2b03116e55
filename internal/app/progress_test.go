package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/progress"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// progressDB returns a new database with the contract's outbox holding
// rows events of distinct aggregates, and a config for it.
func progressDB(t *testing.T, rows int) (*pgx.Conn, string) {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.NewDB(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	for _, stmt := range []string{testenv.ContractOutbox, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || i, 'created', jsonb_build_object('i', i) FROM generate_series(1, %d) i`, rows)} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	yaml := fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: webhook\n  webhook:\n    url: http://127.0.0.1:9/x\n", dsn)
	return admin, yaml
}

// begin opens a transaction on a new connection that writes one outbox
// row, so it holds a lock CREATE INDEX CONCURRENTLY waits for, and returns
// it with its backend pid.
func begin(t *testing.T, dsn string) (pgx.Tx, int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'order', 'writer', 'created', '{}') RETURNING pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return tx, pid
}

// waitOutput waits until out contains want.
func waitOutput(t *testing.T, out *testenv.SyncBuffer, errc <-chan error, want string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(out.String(), want); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-errc:
			t.Fatalf("init ended (%v) before printing %q:\n%s", err, want, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 2 minutes:\n%s", want, out)
		}
	}
}

// TestInitIndexProgress runs relay init on an outbox of 100,000 rows while
// the application's transactions hold the build of the poll index in its
// two writer waits, one after the other: each wait is reported with the
// backend pid it waits for, the build's end with its duration. Holding the
// waits makes the test independent of how fast the table is scanned.
func TestInitIndexProgress(t *testing.T) {
	admin, yaml := progressDB(t, 100_000)
	cfg := parse(t, yaml)
	ctx := context.Background()
	first, firstPID := begin(t, cfg.Postgres.URL)

	out := &testenv.SyncBuffer{}
	errc := make(chan error, 1)
	go func() {
		opts := InitOptions{LockTimeout: 5 * time.Minute, Progress: out, ProgressEvery: progress.Always, ProgressPoll: 5 * time.Millisecond}
		errc <- Init(ctx, cfg, opts, io.Discard, slog.New(slog.DiscardHandler))
	}()
	const index = "index outbox_relay_seq_idx on public.outbox: "
	waitOutput(t, out, errc, fmt.Sprintf(index+"waiting for writers before build: 0/1 transactions done, waiting for the transaction of backend pid %d to end", firstPID))
	// A writer that starts now is not waited for before the build, only
	// before validation.
	second, secondPID := begin(t, cfg.Postgres.URL)
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, errc, fmt.Sprintf(index+"waiting for writers before validation: 0/1 transactions done, waiting for the transaction of backend pid %d to end", secondPID))
	if err := second.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(index) + `built in \d`).MatchString(out.String()) {
		t.Fatalf("no final line:\n%s", out)
	}
	var valid bool
	if err := admin.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_relay_seq_idx'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("index valid %v, %v", valid, err)
	}
	t.Logf("progress:\n%s", out)
}

// TestRedriveProgress dead-letters 5,000 events of 5,000 aggregates and
// redrives them all: the progress lines count up, one per transaction of
// 500 aggregates, and the last reaches the total; every event is back in
// the outbox once.
func TestRedriveProgress(t *testing.T) {
	admin, yaml := progressDB(t, 5000)
	cfg := parse(t, yaml)
	ctx := context.Background()
	l := layoutOf(cfg)
	for _, stmt := range append(l.CreateDeadLetter(nil),
		`INSERT INTO outbox_dead_letter (id, aggregate_type, aggregate_id, event_type, payload, created_at, seq, error)
			SELECT id, aggregate_type, aggregate_id, event_type, payload, created_at, seq, 'boom' FROM outbox`,
		`DELETE FROM outbox`) {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	out := &testenv.SyncBuffer{}
	var result strings.Builder
	opts := DLQOptions{Progress: out, ProgressEvery: progress.Always}
	if err := DLQ(ctx, cfg, DLQRedrive, schema.DeadLetterFilter{}, opts, &result); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(result.String(), "redrove 5000 dead letters") {
		t.Fatalf("result: %s", result.String())
	}
	lines := regexp.MustCompile(`(?m)^redrive: (\d+)/5000 dead letters \(\d+%\)`).FindAllStringSubmatch(out.String(), -1)
	if len(lines) != 10 {
		t.Fatalf("want 10 progress lines, one per 500 aggregates:\n%s", out)
	}
	for i, m := range lines {
		if n, _ := strconv.Atoi(m[1]); n != (i+1)*500 {
			t.Fatalf("line %d counts %d, want %d:\n%s", i, n, (i+1)*500, out)
		}
	}
	if !strings.Contains(out.String(), "redrive: 5000/5000 dead letters done, 5000 back in the outbox\n") {
		t.Fatalf("no final line:\n%s", out)
	}
	var n, distinct int
	if err := admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT id) FROM outbox`).Scan(&n, &distinct); err != nil || n != 5000 || distinct != 5000 {
		t.Fatalf("outbox holds %d rows, %d distinct (%v), want 5000", n, distinct, err)
	}
}

package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/relay/helpers/inbox"
	"github.com/outboxrelay/relay/helpers/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var errBoom = errors.New("boom")

// env is a database with the default inbox table and an effects table,
// through pgx and database/sql.
type env struct {
	pool *pgxpool.Pool
	db   *sql.DB
}

func setup(t *testing.T) env {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(30)
	t.Cleanup(func() { db.Close() })
	if err := inbox.CreateTable(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (message_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return env{pool, db}
}

// increment is the handler's effect: it counts the message in effects.
const increment = `INSERT INTO effects (message_id, n) VALUES ($1, 1)
	ON CONFLICT (message_id) DO UPDATE SET n = effects.n + 1`

// handler returns a pgx handler that applies the effect of id and holds
// its transaction open for hold, so concurrent deliveries overlap.
func handler(id string, hold time.Duration) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, increment, id)
		time.Sleep(hold)
		return err
	}
}

// sqlHandler is handler for database/sql.
func sqlHandler(id string, hold time.Duration) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, increment, id)
		time.Sleep(hold)
		return err
	}
}

// deliver delivers id once, through pgx when viaPgx and database/sql
// otherwise.
func (e env) deliver(ctx context.Context, id string, viaPgx bool) (bool, error) {
	if viaPgx {
		return inbox.Handle(ctx, e.pool, id, handler(id, 5*time.Millisecond))
	}
	return inbox.HandleSQL(ctx, e.db, id, sqlHandler(id, 5*time.Millisecond))
}

// effects returns the effects table: message_id → how often it was applied.
func (e env) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, _ := e.pool.Query(context.Background(), `SELECT message_id, n FROM effects`)
	got := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

// count returns the result of a count(*) query.
func (e env) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConcurrentDuplicates delivers every message several times at once,
// through pgx and database/sql alternately, and checks that each message's
// effect happened exactly once and exactly one delivery reported it.
func TestConcurrentDuplicates(t *testing.T) {
	for _, copies := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d copies", copies), func(t *testing.T) {
			ctx := context.Background()
			e := setup(t)
			const messages = 40
			var processed [messages]atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for m := range messages {
				id := fmt.Sprintf("msg-%d", m)
				for c := range copies {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						ok, err := e.deliver(ctx, id, (m+c)%2 == 0)
						if err != nil {
							t.Errorf("%s delivery %d: %v", id, c, err)
						}
						if ok {
							processed[m].Add(1)
						}
					}()
				}
			}
			close(start)
			wg.Wait()
			got := e.effects(t)
			for m := range messages {
				id := fmt.Sprintf("msg-%d", m)
				if n := processed[m].Load(); n != 1 {
					t.Errorf("%s: %d deliveries reported processed, want 1", id, n)
				}
				if got[id] != 1 {
					t.Errorf("%s: effect applied %d times, want 1", id, got[id])
				}
			}
			if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != messages {
				t.Errorf("%d processed_messages rows, want %d", n, messages)
			}
		})
	}
}

// TestWaitingDelivery holds a first delivery open until a second one of the
// same message waits on its lock, then lets the first commit or roll back.
func TestWaitingDelivery(t *testing.T) {
	for _, firstFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("first fails %v", firstFails), func(t *testing.T) {
			ctx := context.Background()
			e := setup(t)
			claimed, release := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				_, err := inbox.Handle(ctx, e.pool, "m", func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, increment, "m"); err != nil {
						return err
					}
					close(claimed)
					<-release
					if firstFails {
						return errBoom
					}
					return nil
				})
				first <- err
			}()
			<-claimed
			type result struct {
				ok  bool
				err error
			}
			second := make(chan result, 1)
			go func() {
				ok, err := inbox.Handle(ctx, e.pool, "m", handler("m", 0))
				second <- result{ok, err}
			}()
			e.waitForLockWait(t)
			close(release)
			if err := <-first; (err != nil) != firstFails {
				t.Fatalf("first delivery: %v", err)
			}
			r := <-second
			if r.err != nil || r.ok != firstFails {
				t.Errorf("second delivery: processed %v, err %v; want processed %v", r.ok, r.err, firstFails)
			}
			if got := e.effects(t); got["m"] != 1 {
				t.Errorf("effect applied %d times, want 1", got["m"])
			}
		})
	}
}

// waitForLockWait waits until a session of the database waits on a lock.
func (e env) waitForLockWait(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if e.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0 {
			return
		}
	}
	t.Fatal("the second delivery never waited on the first one's lock")
}

// TestHandlerErrorRollsBack checks that a failing handler leaves neither its
// effect nor the record, so the redelivery processes the message.
func TestHandlerErrorRollsBack(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	fail := func(ctx context.Context, tx pgx.Tx) error {
		if err := handler("p", 0)(ctx, tx); err != nil {
			return err
		}
		return errBoom
	}
	failSQL := func(ctx context.Context, tx *sql.Tx) error {
		if err := sqlHandler("s", 0)(ctx, tx); err != nil {
			return err
		}
		return errBoom
	}
	if ok, err := inbox.Handle(ctx, e.pool, "p", fail); ok || !errors.Is(err, errBoom) {
		t.Fatalf("failing handler: processed %v, err %v; want false, errBoom", ok, err)
	}
	if ok, err := inbox.HandleSQL(ctx, e.db, "s", failSQL); ok || !errors.Is(err, errBoom) {
		t.Fatalf("failing database/sql handler: processed %v, err %v; want false, errBoom", ok, err)
	}
	if got := e.effects(t); len(got) != 0 {
		t.Errorf("effects after failures: %v", got)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Errorf("%d records after failures, want 0", n)
	}
	for i, want := range []bool{true, false} {
		for _, viaPgx := range []bool{true, false} {
			id := map[bool]string{true: "p", false: "s"}[viaPgx]
			if ok, err := e.deliver(ctx, id, viaPgx); ok != want || err != nil {
				t.Errorf("%s redelivery %d: processed %v, err %v; want %v", id, i+1, ok, err, want)
			}
		}
	}
	if got := e.effects(t); got["p"] != 1 || got["s"] != 1 {
		t.Errorf("effects after redeliveries: %v, want each once", got)
	}
}

func TestClaim(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	for i, want := range []bool{true, false} {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := inbox.Claim(ctx, tx, "c"); ok != want || err != nil {
			t.Errorf("Claim %d: %v, %v; want %v", i, ok, err, want)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		sqlTx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := inbox.ClaimSQL(ctx, sqlTx, "d"); ok != want || err != nil {
			t.Errorf("ClaimSQL %d: %v, %v; want %v", i, ok, err, want)
		}
		if err := sqlTx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	called := false
	_, err := inbox.Handle(ctx, e.pool, "", func(context.Context, pgx.Tx) error { called = true; return nil })
	if err == nil || called {
		t.Errorf("empty message id: err %v, handler called %v", err, called)
	}
}

func TestPrune(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	if _, err := e.pool.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, processed_at) VALUES
		('a', 'new', now()), ('b', '59m', now() - interval '59 minutes'),
		('a', '2h', now() - interval '2 hours'), ('b', '3d', now() - interval '3 days')`); err != nil {
		t.Fatal(err)
	}
	if n, err := inbox.Prune(ctx, e.pool, time.Hour); n != 2 || err != nil {
		t.Errorf("Prune(1h) = %d, %v; want 2", n, err)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages WHERE message_id IN ('new', '59m')`); n != 2 {
		t.Errorf("Prune(1h) removed a younger record")
	}
	if n, err := inbox.PruneSQL(ctx, e.db, 30*time.Minute); n != 1 || err != nil {
		t.Errorf("PruneSQL(30m) = %d, %v; want 1", n, err)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages WHERE message_id = 'new'`); n != 1 {
		t.Errorf("PruneSQL(30m) removed the new record")
	}
	if _, err := inbox.Prune(ctx, e.pool, 0); err == nil {
		t.Error("Prune(0) succeeded")
	}
	if n := e.count(t, `SELECT count(*) FROM pg_indexes WHERE tablename = 'processed_messages'
		AND indexdef LIKE '%(processed_at)'`); n != 1 {
		t.Error("no index on processed_at")
	}
}

func TestCustomTable(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	tbl, err := inbox.New(`app.consumer "orders"`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE SCHEMA app`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := tbl.CreateTable(ctx, e.pool); err != nil {
			t.Fatal(err)
		}
	}
	want := `CREATE TABLE IF NOT EXISTS "app"."consumer ""orders"""`
	if ddl := tbl.DDL(); !strings.Contains(ddl, want) || !strings.HasSuffix(ddl, ";\n") {
		t.Errorf("DDL:\n%s\nwant it to contain %s", ddl, want)
	}
	for i, want := range []bool{true, false} {
		if ok, err := tbl.Handle(ctx, e.pool, "x", handler("x", 0)); ok != want || err != nil {
			t.Errorf("delivery %d: %v, %v; want %v", i, ok, err, want)
		}
	}
	if n := e.count(t, `SELECT count(*) FROM app."consumer ""orders"""`); n != 1 {
		t.Errorf("%d rows in the custom table, want 1", n)
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Errorf("%d rows in the default table, want 0", n)
	}
	for _, bad := range []string{".x", "x."} {
		if _, err := inbox.New(bad); err == nil {
			t.Errorf("New(%q) succeeded", bad)
		}
	}
}

// TestConsumers delivers the same messages to two consumers sharing the
// default table, concurrently: each consumer's handler runs once per message.
func TestConsumers(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	consumers := []*inbox.Table{inbox.ForConsumer(""), inbox.ForConsumer("billing")}
	if consumers[0].Consumer() != inbox.DefaultConsumer {
		t.Errorf("ForConsumer(\"\") is consumer %q, want %q", consumers[0].Consumer(), inbox.DefaultConsumer)
	}
	var wg sync.WaitGroup
	var processed atomic.Int32
	for c, tbl := range consumers {
		for copy := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				effect := fmt.Sprintf("m@%d", c)
				ok, err := tbl.Handle(ctx, e.pool, "m", handler(effect, 5*time.Millisecond))
				if err != nil {
					t.Errorf("consumer %d copy %d: %v", c, copy, err)
				}
				if ok {
					processed.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if got := e.effects(t); got["m@0"] != 1 || got["m@1"] != 1 || processed.Load() != 2 {
		t.Errorf("effects %v, %d deliveries processed; want each consumer's effect once", got, processed.Load())
	}
	if n := e.count(t, `SELECT count(*) FROM processed_messages WHERE message_id = 'm'`); n != 2 {
		t.Errorf("%d records of m, want one per consumer", n)
	}
}

// TestOldLayout checks that a table of helpers v0.1 is detected, that
// MigrationDDL migrates it, and that its records stay the default
// consumer's.
func TestOldLayout(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE processed_messages (
		message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO processed_messages (message_id) VALUES ('old');
		CREATE TABLE effects (message_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e := env{pool: pool}
	if err := inbox.CreateTable(ctx, pool); !errors.Is(err, inbox.ErrOldLayout) {
		t.Fatalf("CreateTable on the old layout: %v, want ErrOldLayout", err)
	}
	if _, err := inbox.Handle(ctx, pool, "new", handler("new", 0)); !errors.Is(err, inbox.ErrOldLayout) ||
		!strings.Contains(err.Error(), "MigrationDDL") {
		t.Fatalf("Handle on the old layout: %v, want ErrOldLayout naming MigrationDDL", err)
	}
	tbl, _ := inbox.New("")
	for _, stmt := range strings.Split(strings.TrimSpace(tbl.MigrationDDL()), ";\n") {
		if _, err := pool.Exec(ctx, strings.TrimSuffix(stmt, ";")); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if err := inbox.CreateTable(ctx, pool); err != nil {
		t.Fatalf("CreateTable after the migration: %v", err)
	}
	for _, d := range []struct {
		consumer, id string
		want         bool
	}{{"", "old", false}, {"billing", "old", true}, {"", "new", true}, {"", "new", false}} {
		ok, err := inbox.ForConsumer(d.consumer).Handle(ctx, pool, d.id, handler(d.id+"@"+d.consumer, 0))
		if ok != d.want || err != nil {
			t.Errorf("consumer %q message %s: %v, %v; want %v", d.consumer, d.id, ok, err, d.want)
		}
	}
	if got := e.effects(t); len(got) != 2 {
		t.Errorf("effects %v, want old@billing and new@ once", got)
	}
}

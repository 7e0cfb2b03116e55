package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestClaimCommitsSynchronously shows that the claiming transaction commits
// with the session's synchronous_commit: on a cluster whose synchronous
// standby has not connected yet, the claim waits at COMMIT for it, and its
// rows are handed out only once the commit is acknowledged (here when the
// standby requirement is dropped). So no row is published whose commit a
// crash or failover could still undo.
func TestClaimCommitsSynchronously(t *testing.T) {
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{
		Settings: map[string]string{"synchronous_standby_names": "absent", "fsync": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	newPool := func(synchronousCommit string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(pg.DSN("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = synchronousCommit
		cfg.ConnConfig.RuntimeParams["application_name"] = "relay-" + synchronousCommit
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	local := newPool("local") // the test's own writes do not wait for the standby
	mustExec(t, local, layout.CreateOutbox())
	mustExec(t, local, layout.CreatePollIndex())
	newSource(t, local, layout, 10).Close() // creates the dead-letter table
	src := newSource(t, newPool("on"), layout, 10)
	want := insert(t, local, "a", 1)

	type result struct {
		b   capture.Batch
		err error
	}
	done := make(chan result, 1)
	nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		b, err := src.Next(nctx)
		done <- result{b, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := local.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'relay-on' AND wait_event = 'SyncRep'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("claimed %v (err %v) without waiting for the synchronous standby", r.b, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no claim waits for the synchronous standby")
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustExec(t, local, `ALTER SYSTEM SET synchronous_standby_names = ''`)
	mustExec(t, local, `SELECT pg_reload_conf()`)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.b == nil || len(r.b.Events()) != 1 || r.b.Events()[0].ID != want {
		t.Fatalf("claimed %v, want [%s]", r.b, want)
	}
	r.b.Abandon(ctx)
}

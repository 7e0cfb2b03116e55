package poll_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestClaimCommitsAsynchronously shows that the claiming transaction, which
// only takes row locks, does not wait for its commit record to be flushed
// or replicated: on a cluster whose synchronous standby never connects,
// where every other transaction that writes waits at COMMIT, rows are
// still claimed.
func TestClaimCommitsAsynchronously(t *testing.T) {
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
	b := next(t, src, 5*time.Second)
	if b == nil || len(b.Events()) != 1 || b.Events()[0].ID != want {
		t.Fatalf("claimed %v, want [%s]: the claim waited for the synchronous standby", b, want)
	}
	b.Abandon(ctx)
}

package wal_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
)

// TestRoleWithoutReplication checks that New and Check, which share the
// server checks, both name a role that may not replicate and the fix.
func TestRoleWithoutReplication(t *testing.T) {
	ctx := context.Background()
	pool := setup(t, layout)
	role := fmt.Sprintf("norepl_%d", time.Now().UnixNano())
	mustExec(t, pool, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	mustExec(t, pool, "GRANT SELECT ON "+layout.Outbox.Ident()+" TO "+role)
	cfg := pool.Config().Copy()
	cfg.ConnConfig.User = role
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rolePool.Close()

	want := "ALTER ROLE " + schema.Q(role) + " REPLICATION"
	o := options(t, rolePool, layout, 10)
	src, err := wal.New(ctx, o)
	if err == nil {
		src.Close()
		t.Fatal("New succeeded for a role without REPLICATION")
	}
	if !strings.Contains(err.Error(), want) || fault.ClassOf(err) != fault.Permanent {
		t.Errorf("New: %v (class %v), want a permanent error saying %q", err, fault.ClassOf(err), want)
	}
	found := map[string]error{}
	for _, f := range wal.Check(ctx, rolePool, table.Layout(layout), o.Slot, o.Publication, false) {
		found[f.What] = f.Err
	}
	if err := found["wal_level = logical"]; err != nil {
		t.Errorf("Check: wal_level: %v", err)
	}
	if err := found["replication privilege"]; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Check: replication privilege: %v, want %q", err, want)
	}
}

package app

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestUnarchivedIn looks recorded event ids up in the outbox: those whose
// rows were archived (deleted) or never existed are left out, so a Kafka
// sink's recovery drops them from its progress records.
func TestUnarchivedIn(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, testenv.ContractOutbox); err != nil {
		t.Fatal(err)
	}
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()}
	for _, id := range ids[:3] {
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', 'a', 'created', '{}')`, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	l := layoutOf(&config.Config{Outbox: config.Outbox{Table: "outbox"}})
	left, err := unarchivedIn(pool, l, schema.ArchiveDelete)(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	want := []string{ids[0], ids[2]}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("unarchived %v, want %v", left, want)
	}
}

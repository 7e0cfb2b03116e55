package schema

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
)

// TestRing creates the ring outbox with its init steps (twice: the second
// run creates nothing), finds its sequence (CACHE 1, owned by seq) and
// partitions, routes seqs to partitions, and refuses, permanently, an
// outbox that is not partitioned and a ring of another shape. The relay
// role's privileges include TRUNCATE on each partition.
func TestRing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	l, r := Layout(table.DefaultLayout()), Ring{Partitions: 3, Rows: 1000}
	for range 2 {
		for _, s := range l.ringSteps(r) {
			if err := s.Run(ctx, conn); err != nil {
				t.Fatal(err)
			}
		}
	}
	info, err := InspectSource(ctx, conn, l, true)
	if err != nil || info.SeqSequence != "public.outbox_seq_seq" {
		t.Fatalf("inspect: sequence %q, %v", info.SeqSequence, err)
	}
	var cache int64
	if err := conn.QueryRow(ctx, `SELECT seqcache FROM pg_sequence WHERE seqrelid = 'public.outbox_seq_seq'::regclass`).Scan(&cache); err != nil || cache != 1 {
		t.Fatalf("sequence cache %d, %v: want 1", cache, err)
	}
	parts, err := InspectRing(ctx, conn, l, r)
	if want := []string{`"public"."outbox_p0"`, `"public"."outbox_p1"`, `"public"."outbox_p2"`}; err != nil || !slices.Equal(parts, want) {
		t.Fatalf("InspectRing = %v, %v; want %v", parts, err, want)
	}
	if _, err := conn.Exec(ctx, `SELECT setval('outbox_seq_seq', 2999)`); err != nil {
		t.Fatal(err)
	}
	var part string
	err = conn.QueryRow(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES (gen_random_uuid(), 'o', '1', 'e', '{}') RETURNING tableoid::regclass::text`).Scan(&part)
	if err != nil || part != "outbox_p0" {
		t.Fatalf("seq 3000 went to %q, %v: want outbox_p0", part, err)
	}
	for _, tc := range []struct {
		ring Ring
		want string
	}{
		{Ring{Partitions: 4, Rows: 1000}, "is a ring of 3 partitions of 1000 rows, but the config says archive.partitions 4 and archive.partition_rows 1000"},
		{Ring{Partitions: 3, Rows: 2000}, "is a ring of 3 partitions of 1000 rows"},
	} {
		if _, err := InspectRing(ctx, conn, l, tc.ring); err == nil || !strings.Contains(err.Error(), tc.want) || fault.ClassOf(err) != fault.Permanent {
			t.Errorf("InspectRing(%v) = %v, want a permanent error containing %q", tc.ring, err, tc.want)
		}
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox DETACH PARTITION outbox_p2`); err != nil {
		t.Fatal(err)
	}
	if _, err := InspectRing(ctx, conn, l, r); err == nil || !strings.Contains(err.Error(), "has 2 partitions, but archive.partitions is 3 (none for value 2)") {
		t.Errorf("InspectRing without p2 = %v", err)
	}
	plain := l
	plain.Outbox.Name = "plain"
	if _, err := conn.Exec(ctx, plain.CreateOutbox()); err != nil {
		t.Fatal(err)
	}
	if _, err := InspectRing(ctx, conn, plain, r); err == nil || !strings.Contains(err.Error(), "outbox table public.plain is not partitioned") ||
		!strings.Contains(err.Error(), "docs/operations.md") || fault.ClassOf(err) != fault.Permanent {
		t.Errorf("InspectRing of a plain outbox = %v", err)
	}
	privs := l.RunPrivileges(RunNeeds{WAL: true, ArchiveMode: ArchivePartition, Partitions: parts})
	grants := strings.Join(GrantSQL(privs, "relay"), "\n")
	for _, p := range parts {
		if !strings.Contains(grants, "GRANT TRUNCATE ON TABLE "+p+` TO "relay"`) {
			t.Errorf("grants lack TRUNCATE on %s:\n%s", p, grants)
		}
	}
	if !strings.Contains(grants, `GRANT SELECT ON SEQUENCE "public"."outbox_seq_seq"`) {
		t.Errorf("grants lack SELECT on the sequence:\n%s", grants)
	}
}

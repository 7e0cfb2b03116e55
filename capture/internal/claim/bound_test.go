package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
)

// TestUnsettledRowsBounded: once 24 full batches are claimed and not
// settled (published rows wait for their archive), the poller claims no
// more; it claims again as soon as one batch settles. Without the bound
// a relay whose archiving falls behind publishing holds ever more rows.
func TestUnsettledRowsBounded(t *testing.T) {
	pool := setup(t, layout)
	src := newSource(t, pool, layout, 5)
	mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'a' || i, 'step', '{}' FROM generate_series(1, 130) AS i`)
	var open []capture.Batch
	defer func() {
		for _, b := range open {
			complete(t, b)
		}
	}()
	rows := 0
	for rows < 24*5 {
		b := next(t, src, 30*time.Second)
		if b == nil {
			t.Fatalf("no batch after %d rows", rows)
		}
		open = append(open, b)
		rows += len(b.Events())
	}
	if b := next(t, src, 3*time.Second); b != nil {
		open = append(open, b)
		t.Fatalf("claimed %d more rows with %d unsettled", len(b.Events()), rows)
	}
	complete(t, open[0])
	open = open[1:]
	b := next(t, src, 30*time.Second)
	if b == nil {
		t.Fatal("no batch after one settled")
	}
	open = append(open, b)
}

// TestClaimBytes: a claim takes rows while the rows before them hold less
// than MaxBatchBytes (event.Event.Size), at least one, whether the server's
// count stops it (values that do not compress) or the source's (jsonb that
// compresses, whose stored size is far below its size); the rows left are
// claimed next, in seq order.
func TestClaimBytes(t *testing.T) {
	for _, tc := range []struct{ name, pad string }{
		{"incompressible", `(SELECT string_agg(md5(random()::text || j), '') FROM generate_series(1, 3000) AS j)`},
		{"compressible", `repeat('x', 100000)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := setup(t, layout)
			src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: layout, BatchSize: 500,
				Interval: 20 * time.Millisecond, MaxBatchBytes: 300 << 10})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			mustExec(t, pool, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				SELECT gen_random_uuid(), 'order', 'a' || (i % 3), 'step', jsonb_build_object('i', i, 'pad',
					CASE WHEN i = 5 THEN repeat(`+tc.pad+`, 5) ELSE `+tc.pad+` END)
				FROM generate_series(1, 12) AS i`)
			claims, want := 0, 1
			for want <= 12 {
				b := next(t, src, 30*time.Second)
				if b == nil {
					t.Fatalf("row %d not claimed", want)
				}
				claims++
				bytes := 0
				for _, ev := range b.Events() {
					if bytes >= 300<<10 {
						t.Errorf("claim %d goes on after %d bytes", claims, bytes)
					}
					if got := int(ev.Position); got != want {
						t.Fatalf("claim %d: seq %d, want %d", claims, got, want)
					}
					bytes += ev.Size()
					want++
				}
				complete(t, b)
			}
			if claims < 4 {
				t.Errorf("12 rows of about 100 KB and one of 500 KB in %d claims, want at least 4", claims)
			}
		})
	}
}

package poll_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
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

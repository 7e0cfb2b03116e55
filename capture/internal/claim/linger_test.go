package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
)

// TestLingerGathersRows: after a claim that found few rows the poller waits
// Options.Linger before it claims again, so the rows committed meanwhile
// come in one batch; the wait is a lower bound, whatever the machine's
// load.
func TestLingerGathersRows(t *testing.T) {
	const linger = 400 * time.Millisecond
	pool := setup(t, layout)
	src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: layout, BatchSize: 100,
		Interval: 20 * time.Millisecond, Linger: linger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	first := insert(t, pool, "a", 0)
	b := next(t, src, time.Minute)
	if b == nil || ids(b.Events())[0] != first {
		t.Fatalf("claimed %v, want [%s]", b, first)
	}
	claimed := time.Now()
	if err := b.Complete(context.Background(), capture.Outcome{Published: b.Events()}); err != nil {
		t.Fatal(err)
	}
	want := []string{insert(t, pool, "b", 1), insert(t, pool, "c", 2)}
	var got []string
	for len(got) < len(want) {
		b := next(t, src, time.Minute)
		if b == nil {
			t.Fatalf("claimed %v within a minute, want %v", got, want)
		}
		if len(got) == 0 {
			if d := time.Since(claimed); d < linger {
				t.Fatalf("claimed again %v after a claim of one row, want at least the linger %v", d, linger)
			}
		}
		got = append(got, ids(b.Events())...)
	}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// TestArchiveFoldedAfterLinger: a linger longer than a completion waits
// for a claim once the poller stopped claiming still folds the archives
// into the claim after it.
func TestArchiveFoldedAfterLinger(t *testing.T) {
	counter := &archiveCounter{}
	pool := tracedPool(t, counter)
	src, err := claim.New(context.Background(), claim.Options{Pool: pool, Layout: layout, BatchSize: 100,
		Interval: 20 * time.Millisecond, Linger: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	claimed := poller(t, src, 0)
	for i := range 3 {
		insert(t, pool, "a", i)
		select {
		case <-claimed: // Complete returned: the row is archived
		case <-time.After(time.Minute):
			t.Fatalf("event %d not completed within a minute", i)
		}
	}
	if alone := counter.alone.Load(); alone > 0 {
		t.Fatalf("%d of 3 archives ran in transactions of their own, %d folded into claims", alone, counter.folded.Load())
	}
}

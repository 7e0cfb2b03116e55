package claim

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestInFlightOutOfOrder adds batches of ascending seq ranges, as claims
// take them, and removes them in random order, checking after every step
// that above, empty and the row count agree with a plain set of seqs: a set
// that forgot a batch, or dropped the wrong one, would let a claim take a
// row twice.
func TestInFlightOutOfOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var f inFlight
	model := map[int64]bool{}
	var open [][]int64
	next := int64(1)
	check := func() {
		t.Helper()
		for _, from := range []int64{0, 1, next / 3, next / 2, next - 2, next} {
			var want []int64
			for s := range model {
				if s > from {
					want = append(want, s)
				}
			}
			slices.Sort(want)
			got := f.above(from)
			if got == nil {
				t.Fatal("above returned nil: the claim would compare with NULL")
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("above(%d) = %v, want %v", from, got, want)
			}
		}
		if f.empty() != (len(model) == 0) {
			t.Fatalf("empty %v; the set holds %d rows", f.empty(), len(model))
		}
	}
	for range 300 {
		if len(open) < 6 && rng.IntN(2) == 0 {
			n := 1 + rng.IntN(5)
			var b []int64
			for range n {
				next += 1 + int64(rng.IntN(3)) // rows of other partitions or deleted rows leave gaps
				b = append(b, next)
				model[next] = true
			}
			f.add(b, 10*n)
			open = append(open, b)
		} else if len(open) > 0 {
			i := rng.IntN(len(open))
			f.remove(open[i], 10*len(open[i]))
			for _, s := range open[i] {
				delete(model, s)
			}
			open = slices.Delete(open, i, i+1)
		}
		check()
	}
	for _, b := range open {
		f.remove(b, 10*len(b))
		for _, s := range b {
			delete(model, s)
		}
		check()
	}
	if f.bytes != 0 || f.top != 0 {
		t.Fatalf("bytes %d, top %d after every batch settled", f.bytes, f.top)
	}
}

// TestInFlightWaitRoom: waitRoom blocks while the rows in flight reach the
// bound and returns once a batch settles.
func TestInFlightWaitRoom(t *testing.T) {
	var f inFlight
	f.add([]int64{1, 2, 3}, 30)
	f.add([]int64{5, 6}, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.waitRoom(ctx, 5, 1000); err == nil {
		t.Fatal("waitRoom returned with 5 rows in flight and room for 5")
	}
	done := make(chan error, 1)
	go func() { done <- f.waitRoom(context.Background(), 5, 1000) }()
	f.remove([]int64{1, 2, 3}, 30)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("waitRoom still blocked after a batch settled")
	}
}

// BenchmarkInFlight adds and removes 500-row batches, 24 in flight, and
// looks up the rows above a cursor below them once per batch, as a drain
// does: one op is one row.
func BenchmarkInFlight(b *testing.B) {
	var f inFlight
	var open [][]int64
	seq := int64(0)
	b.ReportAllocs()
	for done := 0; done < b.N; done += 500 {
		batch := make([]int64, 500)
		for i := range batch {
			seq++
			batch[i] = seq
		}
		f.add(batch, 500*200)
		open = append(open, batch)
		if len(open) == 24 {
			f.remove(open[0], 500*200)
			open = open[1:]
		}
		_ = f.above(seq)
	}
}

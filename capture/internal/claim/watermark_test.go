package claim

import (
	"fmt"
	"testing"
)

// TestPendingBounded: while one writer stays open and short writers come
// and go, many claims keep the pending pairs' parameters of the safeBound
// statement bounded: each pair keeps only writers that are still open, and
// merged pairs list each writer once.
func TestPendingBounded(t *testing.T) {
	var w watermarks
	for i := range 1000 {
		open := []string{"3/7", fmt.Sprintf("4/%d", i), fmt.Sprintf("5/%d", i)}
		w.advance(int64(i+1), open)
		w.advance(int64(i+1), open[:1])
	}
	seqs, writers := w.flat()
	if len(seqs) != len(writers) {
		t.Fatalf("%d seqs, %d writers", len(seqs), len(writers))
	}
	if len(w.pending) > maxPending || len(writers) > maxPending {
		t.Fatalf("%d pending pairs, %d writer parameters after 1000 claims with one writer open, want at most %d each",
			len(w.pending), len(writers), maxPending)
	}
	for _, m := range w.pending {
		if len(m.writers) != 1 || m.writers[0] != "3/7" {
			t.Fatalf("pair %d keeps writers %v, want [3/7]", m.seq, m.writers)
		}
	}
	if w.safe != 0 {
		t.Fatalf("safe %d while the first writer is open", w.safe)
	}
	w.advance(1001, nil)
	if w.held() || w.safe != 1001 {
		t.Fatalf("after the writer ended: held %v, safe %d, want nothing held and 1001", w.held(), w.safe)
	}
}

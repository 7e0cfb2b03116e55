package claim

import (
	"context"
	"slices"
	"sync"
)

// inFlight is the set of claimed rows whose batch has not settled yet: a
// claim that looks again below the cursor skips them, so a row is never in
// the pipeline twice through one relay. It also counts their payload bytes
// and lets the poller wait while too many rows are unsettled. It keeps each
// batch's seqs as one ascending slice, so adding and removing a batch costs
// no work per row. Safe for concurrent use.
type inFlight struct {
	mu      sync.Mutex
	batches [][]int64 // the seqs of each batch in flight, ascending
	rows    int       // rows in the set
	top     int64     // no seq in the set is above top
	bytes   int       // bytes of the rows in the set (event.Event.Size)
	space   chan struct{}
}

// Unsettled rows (claimed, and not yet archived or dead-lettered) are
// bounded by maxUnsettledBatches full batches and unsettledBatchBytes
// times Options.MaxBatchBytes: the pipeline's window counts only
// unpublished events, and without this bound batches waiting for their
// archive transaction, when archiving falls behind publishing, held memory
// without limit.
const (
	maxUnsettledBatches = 24
	unsettledBatchBytes = 3
)

// add records the seqs of one batch, holding bytes, as in flight.
// The set keeps seqs, which must not change until remove, and which no
// other batch in flight holds.
func (f *inFlight) add(seqs []int64, bytes int) {
	if !slices.IsSorted(seqs) {
		seqs = slices.Sorted(slices.Values(seqs))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(seqs) > 0 {
		f.batches = append(f.batches, seqs)
		f.rows += len(seqs)
		f.top = max(f.top, seqs[len(seqs)-1])
	}
	f.bytes += bytes
}

// remove records that the batch added with seqs, holding bytes, settled.
func (f *inFlight) remove(seqs []int64, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(seqs) > 0 {
		first := slices.Min(seqs)
		if i := slices.IndexFunc(f.batches, func(b []int64) bool { return b[0] == first && len(b) == len(seqs) }); i >= 0 {
			f.rows -= len(f.batches[i])
			f.batches = slices.Delete(f.batches, i, i+1)
		}
	}
	f.bytes -= bytes
	f.top = 0
	for _, b := range f.batches {
		f.top = max(f.top, b[len(b)-1])
	}
	if f.space != nil {
		select {
		case f.space <- struct{}{}:
		default:
		}
	}
}

// waitRoom blocks while at least rows rows or bytes bytes are in flight. One goroutine at a time may wait.
func (f *inFlight) waitRoom(ctx context.Context, rows, bytes int) error {
	for {
		f.mu.Lock()
		if f.rows < rows && f.bytes < bytes {
			f.mu.Unlock()
			return nil
		}
		if f.space == nil {
			f.space = make(chan struct{}, 1)
		}
		space := f.space
		f.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// above returns the seqs in flight that are above from, never nil; none
// while the cursor is past every one, as it is until a claim looks again
// from below.
func (f *inFlight) above(from int64) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []int64{}
	if from >= f.top {
		return out
	}
	for _, b := range f.batches {
		i, _ := slices.BinarySearch(b, from+1)
		out = append(out, b[i:]...)
	}
	return out
}

// empty reports whether no row is in flight.
func (f *inFlight) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows == 0
}

package poll

import (
	"context"
	"sync"
)

// inFlight is the set of claimed rows whose batch has not settled yet: a
// claim that looks again below the cursor skips them, so a row is never in
// the pipeline twice through one relay. It also counts their payload bytes
// and lets the poller wait while too many rows are unsettled. Safe for
// concurrent use.
type inFlight struct {
	mu    sync.Mutex
	seqs  map[int64]struct{}
	top   int64 // no seq in the set is above top
	bytes int   // payload bytes of the rows in the set
	space chan struct{}
}

// Unsettled rows (claimed, and not yet archived or dead-lettered) are
// bounded by maxUnsettledBatches full batches and maxUnsettledBytes of
// payload: the pipeline's window counts only unpublished events, and
// without this bound batches waiting for their archive transaction, when
// archiving falls behind publishing, held memory without limit.
const (
	maxUnsettledBatches = 24
	maxUnsettledBytes   = 24 << 20
)

// add records seqs, with bytes of payload, as in flight.
func (f *inFlight) add(seqs []int64, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seqs == nil {
		f.seqs = make(map[int64]struct{}, len(seqs))
	}
	for _, s := range seqs {
		f.seqs[s] = struct{}{}
		f.top = max(f.top, s)
	}
	f.bytes += bytes
}

// remove records that seqs, with bytes of payload, settled.
func (f *inFlight) remove(seqs []int64, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range seqs {
		delete(f.seqs, s)
	}
	f.bytes -= bytes
	if len(f.seqs) == 0 {
		f.top = 0
	}
	if f.space != nil {
		select {
		case f.space <- struct{}{}:
		default:
		}
	}
}

// waitRoom blocks while at least rows rows or bytes payload bytes are in
// flight. One goroutine at a time may wait.
func (f *inFlight) waitRoom(ctx context.Context, rows, bytes int) error {
	for {
		f.mu.Lock()
		if len(f.seqs) < rows && f.bytes < bytes {
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

// above returns the seqs in flight that are above from; none while the
// cursor is past every one, as it is until a claim looks again from below.
func (f *inFlight) above(from int64) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []int64{}
	if from >= f.top {
		return out
	}
	for s := range f.seqs {
		if s > from {
			out = append(out, s)
		}
	}
	return out
}

// empty reports whether no row is in flight.
func (f *inFlight) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seqs) == 0
}

// payloadBytes returns the payload bytes of the batch's events.
func (b *batch) payloadBytes() int {
	n := 0
	for _, ev := range b.events {
		n += len(ev.Payload)
	}
	return n
}

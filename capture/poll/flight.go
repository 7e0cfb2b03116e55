package poll

import "sync"

// inFlight is the set of claimed rows whose batch has not settled yet: a
// claim that looks again below the cursor skips them, so a row is never in
// the pipeline twice through one relay. Safe for concurrent use.
type inFlight struct {
	mu   sync.Mutex
	seqs map[int64]struct{}
	top  int64 // no seq in the set is above top
}

// add records seqs as in flight.
func (f *inFlight) add(seqs []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seqs == nil {
		f.seqs = make(map[int64]struct{}, len(seqs))
	}
	for _, s := range seqs {
		f.seqs[s] = struct{}{}
		f.top = max(f.top, s)
	}
}

// remove records that seqs settled.
func (f *inFlight) remove(seqs []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range seqs {
		delete(f.seqs, s)
	}
	if len(f.seqs) == 0 {
		f.top = 0
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

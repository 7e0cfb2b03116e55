package claim

import (
	"sync"

	"github.com/outboxrelay/relay/capture"
)

// releases is the claim side of capture.Holder: the keys held, and the
// released keys whose rows claims still skip because a batch of an earlier
// epoch holds rows of theirs that are not settled. Claiming a released
// key's newer row while such a row is in flight would put it before that
// row, which the pipeline leaves in the outbox (its batch is of an earlier
// epoch). It is safe for concurrent use.
type releases struct {
	held      *capture.HeldKeys
	mu        sync.Mutex
	epoch     uint64 // the current epoch, from 1
	pending   []release
	unsettled map[*batch]struct{} // batches handed out and not settled
}

// release is one Release call: its keys and the epoch it began.
type release struct {
	epoch uint64
	keys  map[string]struct{}
}

// Hold notes that the pipeline leaves the events of ordering key key in the
// outbox (see capture.Holder): claims skip its rows until Release.
func (s *Source) Hold(key string) { s.rel.held.Add(key) }

// Release ends the hold of keys (see capture.Holder): their rows are
// claimable again once no batch of an earlier epoch holding rows of theirs
// is unsettled, and the claim that finds so looks from the first seq, so
// they are claimed before any newer row of theirs.
func (s *Source) Release(keys []string) uint64 {
	r := &s.rel
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch = max(r.epoch, 1) + 1
	set := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	r.pending = append(r.pending, release{epoch: r.epoch, keys: set})
	r.held.Remove(keys)
	return r.epoch
}

// begin returns the epoch of a claim about to begin, the keys whose rows it
// skips (held, or released and not claimable yet), and whether a release
// became claimable, which makes the claim look from the first seq.
func (r *releases) begin() (epoch uint64, skip []string, rewind bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	skip = r.held.List()
	keep := r.pending[:0]
	for _, rel := range r.pending {
		if r.inFlight(rel) {
			keep = append(keep, rel)
			for k := range rel.keys {
				skip = append(skip, k)
			}
		} else {
			rewind = true
		}
	}
	clear(r.pending[len(keep):])
	r.pending = keep
	return max(r.epoch, 1), skip, rewind
}

// inFlight reports whether a batch of an epoch before rel's holds an
// unsettled row of one of its keys.
func (r *releases) inFlight(rel release) bool {
	for b := range r.unsettled {
		if b.epoch >= rel.epoch {
			continue
		}
		for _, ev := range b.events {
			if _, ok := rel.keys[ev.Key()]; ok {
				return true
			}
		}
	}
	return false
}

// add notes that b was handed out.
func (r *releases) add(b *batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unsettled == nil {
		r.unsettled = make(map[*batch]struct{})
	}
	r.unsettled[b] = struct{}{}
}

// settle notes that b was completed or abandoned.
func (r *releases) settle(b *batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.unsettled, b)
}

package capture

import (
	"maps"
	"slices"
	"sync"
)

// Holder is a Source that lets the pipeline leave the events of an
// aggregate held by a broken destination in the outbox, rather than in
// memory, and captures them again when the destination works. Its methods
// are safe for concurrent use with Next.
//
// A Holder numbers its captures with a Ledger: every batch Next returns
// reports, through EpochOf, the epoch in which its capture began. The
// invariant both sides keep is: a batch of an epoch at or above the one
// Release returned holds rows of the released keys only from their oldest
// row left in the outbox on, in source order; a batch of an earlier epoch
// may hold any of their rows, and the pipeline leaves those in the outbox.
type Holder interface {
	// Hold notes that the pipeline leaves every event of ordering key key
	// (event.Event.Key) in the outbox until Release: the source may stop
	// capturing them. Batches completing with such events left must keep
	// them in the outbox for good, whatever the source's position.
	Hold(key string)
	// Release ends the hold of keys and returns the epoch from which the
	// source's batches may carry their rows again (see the invariant
	// above): it captures the rows left for them again, in source order and
	// before any newer row of theirs, once the batches of earlier epochs
	// that hold rows of theirs have settled.
	Release(keys []string) uint64
}

// HeldKeys is a set of ordering keys held in the outbox (see Holder). It
// is safe for concurrent use; the zero value is empty.
type HeldKeys struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// Add adds key.
func (h *HeldKeys) Add(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[string]struct{})
	}
	h.keys[key] = struct{}{}
}

// Remove removes keys.
func (h *HeldKeys) Remove(keys []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, k := range keys {
		delete(h.keys, k)
	}
}

// Has reports whether key is held.
func (h *HeldKeys) Has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.keys[key]
	return ok
}

// List returns the keys, never nil.
func (h *HeldKeys) List() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.AppendSeq(make([]string, 0, len(h.keys)), maps.Keys(h.keys))
}

// Len returns how many keys are held.
func (h *HeldKeys) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}

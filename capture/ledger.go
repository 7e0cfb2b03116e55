package capture

import (
	"context"
	"sync"
	"sync/atomic"
)

// Ledger numbers a Holder source's captures by release epoch and counts
// those not settled yet, so that the source and the pipeline agree on which
// batches began before a Release (see Holder). The epoch starts at 1 and
// Advance raises it by one. It is safe for concurrent use; the zero value
// is ready.
type Ledger struct {
	mu      sync.Mutex
	epoch   uint64         // 0 stands for 1
	open    map[uint64]int // captures begun and not settled, by epoch
	changed chan struct{}  // closed and replaced when a capture settles
}

// Begin notes that a capture begins and returns its epoch. End or the
// Complete or Abandon of the batch Track returns settles it.
func (l *Ledger) Begin() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open == nil {
		l.open = make(map[uint64]int)
	}
	e := max(l.epoch, 1)
	l.open[e]++
	return e
}

// End settles a capture of epoch that handed out no batch.
func (l *Ledger) End(epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[epoch]--; l.open[epoch] <= 0 {
		delete(l.open, epoch)
	}
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Advance starts a new epoch, for a Release, and returns it: captures that
// begin from now on have it.
func (l *Ledger) Advance() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epoch = max(l.epoch, 1) + 1
	return l.epoch
}

// SettledBefore reports whether every capture of an epoch below epoch has
// settled.
func (l *Ledger) SettledBefore(epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for e := range l.open {
		if e < epoch {
			return false
		}
	}
	return true
}

// Changed returns a channel closed when a capture next settles.
func (l *Ledger) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// Track returns b, the batch of a capture of epoch, as a batch whose
// Complete or Abandon, whichever comes first, settles the capture, and
// whose epoch EpochOf reports.
func (l *Ledger) Track(b Batch, epoch uint64) Batch {
	return &tracked{Batch: b, l: l, epoch: epoch}
}

// tracked is a batch a Ledger counts until it settles.
type tracked struct {
	Batch
	l       *Ledger
	epoch   uint64
	settled atomic.Bool
}

func (b *tracked) Epoch() uint64 { return b.epoch }

func (b *tracked) Unwrap() Batch { return b.Batch }

func (b *tracked) Complete(ctx context.Context, o Outcome) error {
	defer b.settle()
	return b.Batch.Complete(ctx, o)
}

func (b *tracked) Abandon(ctx context.Context) {
	defer b.settle()
	b.Batch.Abandon(ctx)
}

func (b *tracked) settle() {
	if b.settled.CompareAndSwap(false, true) {
		b.l.End(b.epoch)
	}
}

// EpochOf returns the Ledger epoch of b, looking through wrappers that
// have an Unwrap method returning the batch they wrap, or 0 when b was not
// tracked by a Ledger.
func EpochOf(b Batch) uint64 {
	for b != nil {
		switch x := b.(type) {
		case interface{ Epoch() uint64 }:
			return x.Epoch()
		case interface{ Unwrap() Batch }:
			b = x.Unwrap()
		default:
			return 0
		}
	}
	return 0
}

package wal

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/internal/schema"
)

// drain publishes the outbox rows with seq ≤ to by claiming them from the
// table (capture/internal/claim, as poll capture does), before streaming
// from a slot that was created after they were committed.
// It is used by the goroutine calling Next; its batches are completed from
// others.
type drain struct {
	owner       *Source
	src         batchSource
	to          int64
	outstanding atomic.Int64  // drained batches not completed or abandoned
	settled     chan struct{} // signalled when a drained batch settles
	events      int
	began       time.Time
}

// batchSource is where a drain takes its batches from: a claim.Source, or
// for an outbox lacking a column claims need a scan.
type batchSource interface {
	Next(ctx context.Context) (capture.Batch, error)
	Close() error
}

func (s *Source) newDrain(ctx context.Context, to int64) (*drain, error) {
	if len(s.info.Missing) > 0 {
		return &drain{owner: s, src: newScan(s), to: to, settled: make(chan struct{}, 1), began: time.Now()}, nil
	}
	mode := s.opts.ArchiveMode
	if s.opts.ring() {
		mode = schema.ArchiveDelete // drained rows are not in the slot's stream: the truncator cannot tell they were published
	}
	src, err := claim.New(ctx, claim.Options{Pool: s.opts.Pool, Layout: s.layout, BatchSize: s.opts.BatchSize,
		MaxBatchBytes: s.opts.MaxBatchBytes, ArchiveMode: mode, MaxSeq: to, Held: &s.held, Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	return &drain{owner: s, src: src, to: to, settled: make(chan struct{}, 1), began: time.Now()}, nil
}

// next returns the next drained batch, or nil once every row up to the
// bound was claimed and every drained batch settled. A batch whose archive
// failed leaves its rows in the outbox, and they are claimed again. It
// fails when term ends.
func (d *drain) next(ctx, term context.Context) (capture.Batch, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(term, cancel)()
	for {
		settled := d.outstanding.Load() == 0
		b, err := d.src.Next(ctx)
		switch {
		case term.Err() != nil:
			if b != nil {
				b.Abandon(context.WithoutCancel(ctx))
			}
			return nil, errors.New("lost the wal capture lock while draining")
		case errors.Is(err, claim.ErrDrained) && settled:
			return nil, nil
		case errors.Is(err, claim.ErrDrained):
			select {
			case <-d.settled:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case err != nil:
			return nil, fmt.Errorf("drain: %w", err)
		default:
			d.outstanding.Add(1)
			d.events += len(b.Events())
			return d.track(b), nil
		}
	}
}

// track wraps b to count it until it settles.
func (d *drain) track(b capture.Batch) *drained {
	db := &drained{Batch: b, d: d}
	d.owner.drainedMu.Lock()
	d.owner.unsettled[db] = true
	d.owner.drainedMu.Unlock()
	return db
}

// drained is a batch of the drain; it tells the drain when it settled.
// Complete or Abandon runs once: Source.Close abandons batches the pipeline
// left unsettled.
type drained struct {
	capture.Batch
	d       *drain
	settled atomic.Bool
}

// Complete archives the batch as the claim's own batches are archived.
func (b *drained) Complete(ctx context.Context, o capture.Outcome) error {
	if !b.settle() {
		return errors.New("drained batch already abandoned")
	}
	defer b.release()
	return b.Batch.Complete(ctx, o)
}

// Abandon releases the batch's rows to be claimed again.
func (b *drained) Abandon(ctx context.Context) {
	if b.settle() {
		defer b.release()
		b.Batch.Abandon(ctx)
	}
}

func (b *drained) settle() bool { return b.settled.CompareAndSwap(false, true) }

func (b *drained) release() {
	o := b.d.owner
	o.drainedMu.Lock()
	delete(o.unsettled, b)
	o.drainedMu.Unlock()
	b.d.outstanding.Add(-1)
	signal(b.d.settled)
}

package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/sink"
)

// recordedSource is a source whose batches leave out the events a
// sink.Recorder recorded as published by an earlier run: they are archived
// with the batch, never published again. Before each batch it makes sure
// the recorder is recovered (a no-op while it is), so that a standby relay,
// which gets no batch, fences nobody, and a relay that leads again after
// another one fenced it recovers before it publishes. Next is called from
// one goroutine, like the source's.
type recordedSource struct {
	capture.Source
	rec        sink.Recorder
	unarchived sink.Unarchived
}

// Next returns the source's next batch without the recorded events; a
// batch of recorded events only is archived at once.
func (s *recordedSource) Next(ctx context.Context) (capture.Batch, error) {
	for {
		b, err := s.Source.Next(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.rec.Recover(ctx, s.unarchived); err != nil {
			b.Abandon(context.WithoutCancel(ctx))
			return nil, err
		}
		rb := s.split(b)
		if len(rb.rest) > 0 || len(rb.recorded) == 0 {
			return rb, nil
		}
		if err := rb.Complete(ctx, capture.Outcome{}); err != nil {
			return nil, err
		}
	}
}

// unarchivedIn returns the sink.Unarchived of the outbox of layout l with
// archive mode mode, looking ids up on pool.
func unarchivedIn(pool *pgxpool.Pool, l schema.Layout, mode string) sink.Unarchived {
	return func(ctx context.Context, ids []string) ([]string, error) {
		info, err := schema.InspectFor(ctx, pool, l, true)
		if err != nil {
			return nil, err
		}
		// The ids go as text[] and are cast in SQL, as the wal source's.
		rows, err := pool.Query(ctx, l.UnarchivedByID(mode, "text[]::"+info.Types[l.Cols.ID]), ids)
		if err != nil {
			return nil, fmt.Errorf("look up recorded events in %s: %w", l.Outbox, err)
		}
		left, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("look up recorded events in %s: %w", l.Outbox, err)
		}
		return left, nil
	}
}

// split sorts b's events into those recorded as published and the rest.
func (s *recordedSource) split(b capture.Batch) *recordedBatch {
	evs := b.Events()
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	rb := &recordedBatch{Batch: b, rec: s.rec, rest: evs}
	done := s.rec.Recorded(ids)
	for i, ev := range evs {
		if done[i] {
			if rb.recorded == nil {
				rb.rest = make([]*event.Event, 0, len(evs))
				rb.rest = append(rb.rest, evs[:i]...)
			}
			rb.recorded = append(rb.recorded, ev)
		} else if rb.recorded != nil {
			rb.rest = append(rb.rest, ev)
		}
	}
	return rb
}

// recordedBatch is a batch whose recorded events count as published.
type recordedBatch struct {
	capture.Batch
	rec      sink.Recorder
	recorded []*event.Event
	rest     []*event.Event
}

// Unwrap returns the source's batch (see capture.EpochOf).
func (b *recordedBatch) Unwrap() capture.Batch { return b.Batch }

// Events returns the batch's events that were not recorded as published.
func (b *recordedBatch) Events() []*event.Event { return b.rest }

// Complete archives the published and the recorded events, then tells the
// recorder which rows left the outbox.
func (b *recordedBatch) Complete(ctx context.Context, o capture.Outcome) error {
	o.Published = append(o.Published, b.recorded...)
	if err := b.Batch.Complete(ctx, o); err != nil {
		return err
	}
	ids := make([]string, 0, len(o.Published)+len(o.Dead))
	for _, ev := range o.Published {
		ids = append(ids, ev.ID)
	}
	for _, d := range o.Dead {
		ids = append(ids, d.Event.ID)
	}
	b.rec.Archived(ids)
	return nil
}

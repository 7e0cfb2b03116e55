// Package capture defines how outbox rows enter the relay: a Source yields
// batches of events in source order and archives them once the pipeline has
// settled every event of a batch.
package capture

import (
	"context"
	"errors"

	"github.com/outboxrelay/relay/event"
)

// Source captures outbox rows. Next is called from a single goroutine.
type Source interface {
	// Next blocks until a batch of events is available, in source order
	// (seq in poll mode, commit order in wal mode), or ctx is done.
	Next(ctx context.Context) (Batch, error)
	// Close releases the source's connections. Batches not yet completed
	// are abandoned.
	Close() error
}

// Health is implemented by sources that report whether they can capture
// at any moment, also while Next waits for rows, so readiness follows the
// source's connections to Postgres and not the last batch: a source is
// capturing once its connections are up and their last statements worked,
// whether or not rows are waiting, and stops capturing as soon as one of
// them fails or Next returns an error, until it has reconnected. A source
// that stands by for another relay (wal mode) is capturing while it
// reaches Postgres.
type Health interface {
	// Capturing reports whether the source can capture now. It is safe
	// for concurrent use.
	Capturing() bool
}

// Batch is a group of captured events that is archived as a unit.
// Complete or Abandon is called exactly once, possibly from another
// goroutine than the one that called Next, and batches may be completed in
// any order.
type Batch interface {
	// Events returns the batch's events in source order. After Complete a
	// source may release them and return nil.
	Events() []*event.Event
	// Complete archives the published events (per archive.mode) and moves the
	// dead events to the dead-letter table, atomically. The events neither
	// published nor dead stay in the outbox and are captured again.
	Complete(ctx context.Context, o Outcome) error
	// Abandon releases the batch without archiving anything; its events are
	// captured again later with the same ids.
	Abandon(ctx context.Context)
}

// Outcome is what the pipeline did with each event of a batch.
type Outcome struct {
	// Published are the events the broker acknowledged.
	Published []*event.Event
	// Dead are the events that failed for good.
	Dead []DeadEvent
}

// Left returns the indexes of the events of evs, a batch's events, that o
// neither published nor dead-lettered: they stay in the outbox.
func (o Outcome) Left(evs []*event.Event) []int {
	if len(o.Published)+len(o.Dead) >= len(evs) {
		return nil
	}
	settled := make(map[*event.Event]bool, len(o.Published)+len(o.Dead))
	for _, ev := range o.Published {
		settled[ev] = true
	}
	for _, d := range o.Dead {
		settled[d.Event] = true
	}
	var left []int
	for i, ev := range evs {
		if !settled[ev] {
			left = append(left, i)
		}
	}
	return left
}

// DeadEvent is an event that goes to the dead-letter table.
type DeadEvent struct {
	Event    *event.Event
	Err      string // the last error; the sources write it escaped and cut with rowtext.Error
	Class    string // the last error's class, see fault.Class
	Attempts int
	// FirstFailed and LastFailed are Unix nanoseconds.
	FirstFailed, LastFailed int64
}

// ErrArchive marks a Next error that says the source stopped because a
// batch's archive failed (wal mode ends its stream then): the failure is
// the archive's, which the batch's Complete also returned.
var ErrArchive = errors.New("archive failed")

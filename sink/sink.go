// Package sink defines the interface every message broker adapter
// implements. Sinks classify their errors with package fault.
package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxrelay/relay/event"
)

// Sink publishes events to a broker.
//
// Publish sends every event of batch and returns only when the broker
// acknowledged each of them or the attempt failed. It returns nil when all
// events were acknowledged, a *BatchError when some were not, or another error
// when none were. The pipeline never has two batches in flight that share an
// aggregate, and puts two events of one aggregate in the same batch only when
// the sink implements Ordered; otherwise a sink needs no ordering logic of its
// own. Publish is called from several goroutines at once.
type Sink interface {
	Publish(ctx context.Context, batch []*event.Event) error
	// Close releases the sink's connections. In-flight publishes fail.
	Close() error
}

// BatchError reports which events of a batch failed. Errs is indexed like the
// batch; a nil entry means that event was acknowledged.
type BatchError struct {
	Errs []error
}

// Error summarises the failures.
func (e *BatchError) Error() string {
	n, first := 0, error(nil)
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("%d of %d events failed, first: %v", n, len(e.Errs), first)
}

// Failed returns the error of the i-th event of a batch whose Publish
// returned err, or nil when that event was acknowledged.
func Failed(err error, i int) error {
	if err == nil {
		return nil
	}
	var be *BatchError
	if errors.As(err, &be) && i < len(be.Errs) {
		return be.Errs[i]
	}
	return err
}

// Ordered is implemented by sinks that can take several events of one
// aggregate (here: of one ordering key, event.Event.Key, the aggregate id by
// default) in one Publish call without breaking their order. The
// pipeline then sends up to MaxPerAggregate consecutive events of an
// aggregate that go to the same destination in one call, in their order,
// instead of one event per call.
//
// Such a sink delivers the events of one aggregate in a batch in batch
// order, and when one of them fails it reports every later event of that
// aggregate in the batch as failed too. It must never let a later event be
// stored while an earlier one of the same aggregate in the batch failed and
// was not (or may not have been) stored before it; an event it did not try
// to publish for that reason fails with an error wrapping ErrHeldBack. The
// pipeline publishes the events after a failed one again, after it, without
// counting an attempt against them, whatever the sink reported for them.
type Ordered interface {
	// MaxPerAggregate returns the most events of one aggregate one Publish
	// call may carry; values below 2 turn the capability off.
	MaxPerAggregate() int
}

// ErrHeldBack marks an event a sink implementing Ordered did not publish
// because an earlier event of its aggregate in the same batch failed or
// had to be published alone. The event is not at fault.
var ErrHeldBack = errors.New("held back behind an earlier event of its aggregate")

// Destinations is implemented by sinks that publish to more than one
// destination or can check one without publishing. The pipeline keeps one
// circuit breaker per destination name; with a sink that does not
// implement Destinations, all events share one.
type Destinations interface {
	// DestinationOf returns where e is published: the resolved topic,
	// subject, queue or URL, without credentials.
	DestinationOf(e *event.Event) string
	// Probe checks cheaply and without publishing that dest, a value
	// DestinationOf returned or Broker, can be published to. It returns
	// nil when it can, an error when not, and ErrNoProbe when the sink has
	// no such check for dest.
	Probe(ctx context.Context, dest string) error
}

// RowRouted is implemented by sinks implementing Destinations whose
// destinations may be chosen by the values of rows: a destination template
// with a placeholder. The pipeline does not let a broken destination that
// rows chose make the relay not ready, unless every such destination in
// use is broken and none has worked (see pipeline.Stats.Ready).
type RowRouted interface {
	// RowChosen reports whether row values choose the destinations
	// DestinationOf returns. Broker is never row-chosen.
	RowChosen() bool
}

// RowChosen reports whether s implements RowRouted and its RowChosen is
// true; a sink wrapping another passes it on with it.
func RowChosen(s any) bool {
	r, ok := s.(RowRouted)
	return ok && r.RowChosen()
}

// Broker is the destination name Probe takes for the broker as a whole
// (the connection, the credentials, the cluster).
const Broker = "(broker)"

// ErrNoProbe is returned by Probe for a destination the sink cannot check
// without publishing.
var ErrNoProbe = errors.New("no probe for this destination")

// Recorder is implemented by sinks that record in the broker, atomically
// with what they publish, which events they published (Kafka with
// transactions). A relay asks it which captured events an earlier run
// already published, archives those without publishing them again, and
// tells it which rows left the outbox.
type Recorder interface {
	// Recover makes the recorder ready to publish: when it is not (before
	// the first call, and after another relay took over its records), it
	// fences every other relay publishing for this one and reads what
	// they recorded, keeping only the events unarchived reports still in
	// the outbox. It returns at once while ready. The relay calls it
	// before each batch it captured, never while standing by, and it
	// retries until ctx ends; an error classified fault.Permanent is a
	// configuration that retrying cannot fix.
	Recover(ctx context.Context, unarchived Unarchived) error
	// Recorded reports, for each of ids, whether its event was published
	// and its row not reported archived since.
	Recorded(ids []string) []bool
	// Archived reports that the rows of ids left the outbox.
	Archived(ids []string)
}

// Unarchived returns those of ids whose rows are still in the outbox and
// not archived, in any order.
type Unarchived func(ctx context.Context, ids []string) ([]string, error)

// Package sink defines the interface every message broker adapter implements
// and the error classes the pipeline acts on.
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
// when none were. The pipeline never puts two events of one aggregate in the
// same batch, and never has two batches in flight that share an aggregate, so
// a sink needs no ordering logic of its own. Publish is called from several
// goroutines at once.
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

// Class says how the pipeline treats a failed publish.
type Class int

const (
	// Transient failures are retried with backoff and count as attempts of
	// the event; after retry.max_attempts the event is dead-lettered. An
	// error that declares no class is transient.
	Transient Class = iota
	// Unavailable failures are failures of the destination rather than of
	// the event: the broker or receiver cannot be reached, refuses the
	// relay's credentials or permissions, or has no such topic, subject,
	// queue, stream or route. They never count as attempts and never
	// dead-letter: the pipeline stops publishing to that destination and
	// probes it with backoff, for as long as it takes.
	Unavailable
	// Permanent failures can never succeed (an oversized message, an invalid
	// destination); the event is dead-lettered at once.
	Permanent
)

// String returns the class name used in logs, metrics and the dead-letter
// table's error_class column.
func (c Class) String() string {
	switch c {
	case Unavailable:
		return "unavailable"
	case Permanent:
		return "permanent"
	default:
		return "transient"
	}
}

// ClassOf classifies err by behaviour: an error in the chain with
// Retryable() == false is Permanent, one with Unavailable() == true is
// Unavailable, anything else is Transient.
func ClassOf(err error) Class {
	var r interface{ Retryable() bool }
	if errors.As(err, &r) && !r.Retryable() {
		return Permanent
	}
	var u interface{ Unavailable() bool }
	if errors.As(err, &u) && u.Unavailable() {
		return Unavailable
	}
	return Transient
}

type classified struct {
	err     error
	class   Class
	suspect bool
}

func (e *classified) Error() string     { return e.err.Error() }
func (e *classified) Unwrap() error     { return e.err }
func (e *classified) Retryable() bool   { return e.class != Permanent }
func (e *classified) Unavailable() bool { return e.class == Unavailable }

// AsPermanent marks err as a failure that can never succeed.
func AsPermanent(err error) error { return &classified{err: err, class: Permanent} }

// AsUnavailable marks err as a failure of the destination (see
// Unavailable).
func AsUnavailable(err error) error { return &classified{err: err, class: Unavailable} }

func (e *classified) Suspect() bool { return e.suspect || IsSuspect(e.err) }

// AsSuspect marks err, keeping its class, as an event-level failure that a
// destination refusing every event would also produce, such as an HTTP 400
// or 500: the pipeline counts it against the event only while other events
// to the same destination succeed, and treats it as a failure of the
// destination otherwise.
func AsSuspect(err error) error { return &classified{err: err, class: ClassOf(err), suspect: true} }

// IsSuspect reports whether err was marked with AsSuspect.
func IsSuspect(err error) bool {
	var s interface{ Suspect() bool }
	return errors.As(err, &s) && s.Suspect()
}

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

// Broker is the destination name Probe takes for the broker as a whole
// (the connection, the credentials, the cluster).
const Broker = "(broker)"

// ErrNoProbe is returned by Probe for a destination the sink cannot check
// without publishing.
var ErrNoProbe = errors.New("no probe for this destination")

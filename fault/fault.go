// Package fault classifies errors by behaviour: an error says whether
// retrying can help (Retryable) and whether the failure is the
// destination's rather than the event's (Unavailable, Suspect). Sinks,
// capture and the schema code mark their errors; the pipeline acts on the
// class. It imports only the standard library, so every layer can use it.
package fault

import "errors"

// Class says how the pipeline treats a failed operation.
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

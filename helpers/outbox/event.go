package outbox

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// ErrInvalidEvent is wrapped by the errors that Write and WriteMany return
// for an event that fails validation; nothing is written then.
var ErrInvalidEvent = errors.New("invalid event")

// Event is one event to write to the outbox.
type Event struct {
	// ID is the event's id, the message_id of every delivery. The zero UUID
	// means a new UUIDv7, whose leading timestamp orders ids by creation
	// time (strictly increasing within one process).
	ID uuid.UUID
	// AggregateType routes the event (topic, subject, queue). Required.
	AggregateType string
	// AggregateID is the ordering key: the relay keeps the order of one
	// aggregate's events. Required.
	AggregateID string
	// EventType names what happened. Required.
	EventType string
	// Payload is the body. []byte and json.RawMessage are stored as they
	// are; any other value, a string included, is marshalled with
	// encoding/json. It must not be nil.
	Payload any
	// Headers are forwarded as message headers. Keys must not be empty. A
	// nil or empty map stores NULL.
	Headers map[string]string
}

// args returns the event's column values in written order, the id (a
// string) first, the payload as []byte when binary and as a string
// otherwise.
func (e Event) args(binary bool) ([]any, error) {
	if err := e.validate(); err != nil {
		return nil, err
	}
	payload, err := encodePayload(e.Payload)
	if err != nil {
		return nil, err
	}
	id := e.ID
	if id == uuid.Nil {
		if id, err = uuid.NewV7(); err != nil {
			return nil, fmt.Errorf("new UUIDv7: %w", err)
		}
	}
	var p any = string(payload)
	if binary {
		p = payload
	}
	return []any{id.String(), e.AggregateType, e.AggregateID, e.EventType, p, encodeHeaders(e.Headers)}, nil
}

// validate checks the required fields and the header keys.
func (e Event) validate() error {
	switch {
	case e.AggregateType == "":
		return fmt.Errorf("%w: empty aggregate type", ErrInvalidEvent)
	case e.AggregateID == "":
		return fmt.Errorf("%w: empty aggregate id", ErrInvalidEvent)
	case e.EventType == "":
		return fmt.Errorf("%w: empty event type", ErrInvalidEvent)
	}
	if _, ok := e.Headers[""]; ok {
		return fmt.Errorf("%w: header with an empty key", ErrInvalidEvent)
	}
	return nil
}

// encodePayload returns raw bytes as they are and marshals anything else.
func encodePayload(p any) ([]byte, error) {
	var b []byte
	switch p := p.(type) {
	case []byte:
		b = p
	case json.RawMessage:
		b = p
	case nil:
	default:
		m, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: marshal payload: %v", ErrInvalidEvent, err)
		}
		b = m
	}
	if b == nil {
		return nil, fmt.Errorf("%w: nil payload", ErrInvalidEvent)
	}
	return b, nil
}

// encodeHeaders returns the headers as JSON text, or nil (NULL) for none.
// Marshalling a map[string]string cannot fail.
func encodeHeaders(h map[string]string) any {
	if len(h) == 0 {
		return nil
	}
	b, _ := json.Marshal(h)
	return string(b)
}

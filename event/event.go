// Package event defines the outbox event that flows from a capture source
// through the pipeline to a sink.
package event

import (
	"bytes"
	"strings"
	"time"
)

// Event is one outbox row. Events are passed by pointer and must not be
// modified after the source produced them, so sinks and the pipeline can read
// them concurrently without locking.
type Event struct {
	// ID is the row's id in canonical UUID text form; it is the message_id on
	// every delivery of the event.
	ID string
	// AggregateType routes the event (topic, subject, queue).
	AggregateType string
	// AggregateID is the row's aggregate id. It orders events unless the
	// outbox has another order column: see Key.
	AggregateID string
	// OrderKey is the text of the row's outbox.order_by column when that is
	// not the aggregate id; empty otherwise, and when the column is NULL or
	// empty.
	OrderKey string
	// EventType names what happened.
	EventType string
	// Payload is the body, byte for byte as stored in the payload column.
	Payload []byte
	// ContentType describes Payload: application/json for json and jsonb
	// columns, text/plain; charset=utf-8 for text and application/octet-stream
	// for bytea.
	ContentType string
	// Headers is the row's optional string map, forwarded as message headers.
	// It is nil when the column is NULL.
	Headers map[string]string
	// CreatedAt is the row's created_at.
	CreatedAt time.Time
	// Position is the event's place in its source: seq in poll mode, the
	// commit LSN in wal mode. It only orders events of one source.
	Position uint64
}

// Key returns the event's ordering and partition key: OrderKey, or
// AggregateID when OrderKey is empty. Events with one key are published in
// source order; it is also the Kafka record key and the SQS message group.
func (e *Event) Key() string {
	if e.OrderKey != "" {
		return e.OrderKey
	}
	return e.AggregateID
}

// Content types set by the capture sources from the payload column's type.
const (
	ContentTypeJSON   = "application/json"
	ContentTypeText   = "text/plain; charset=utf-8"
	ContentTypeBinary = "application/octet-stream"
)

// Overhead is what Size counts for one event besides its bytes: the Event
// value, its pointers in the batches and queues that hold it, and the
// strings' and map's headers.
const Overhead = 512

// Size returns the memory one event holds, about: its payload, header
// names and values and strings, plus Overhead. Captured events are bounded
// by their total Size.
func (e *Event) Size() int {
	n := Overhead + len(e.Payload) + len(e.ID) + len(e.AggregateType) + len(e.AggregateID) + len(e.OrderKey) +
		len(e.EventType) + len(e.ContentType)
	for k, v := range e.Headers {
		n += len(k) + len(v) + 32
	}
	return n
}

// Clone returns a copy of e that shares no memory with it, so that keeping
// the copy does not keep alive the buffers e's values were read into.
func (e *Event) Clone() *Event {
	c := *e
	for _, s := range []*string{&c.ID, &c.AggregateType, &c.AggregateID, &c.OrderKey, &c.EventType, &c.ContentType} {
		*s = strings.Clone(*s)
	}
	c.Payload = bytes.Clone(e.Payload)
	if e.Headers != nil {
		c.Headers = make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			c.Headers[strings.Clone(k)] = strings.Clone(v)
		}
	}
	return &c
}

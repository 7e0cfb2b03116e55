// Package debezium shapes events as Debezium's outbox event router
// (io.debezium.transforms.outbox.EventRouter) publishes them, so that
// consumers written for Debezium read what the relay publishes unchanged;
// sink.format: debezium selects it. The relay applies a Format to every
// batch before the sink sees it, so every sink gets the shape without code
// of its own: the sink's destination template routes the event (its
// default becomes outbox.event.{aggregate_type}), and the sink publishes
// the shaped event's key, headers and payload as it publishes any event's.
//
// The shape is the router's defaults with Kafka Connect's JsonConverter
// (schemas.enable=false) for key and value and the SimpleHeaderConverter
// for headers, as in Debezium's documented messages:
//   - the key is the ordering key (the aggregate id by default) as a JSON
//     string, or as it is with the string key converter;
//   - the id header holds the event id, and each header placement a header
//     of its own, values as they are;
//   - the value is the payload as a JSON string (bytea payloads as base64
//     in one), the expanded JSON document with ExpandJSON, or the payload
//     bytes as they are with the string value converter; with envelope
//     placements it is an object {"payload": ..., alias: value, ...}.
//
// The relay's own headers (message_id and the others) stay; Debezium's
// consumers ignore headers they do not know.
package debezium

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/outboxrelay/relay/event"
)

// Field is an event value a placement copies.
type Field int

// The fields a placement can copy.
const (
	FieldID Field = iota
	FieldAggregateType
	FieldAggregateID
	FieldEventType
	// FieldOrderKey is the outbox.order_by column's text (event.Event.Key).
	FieldOrderKey
)

// value returns f's value in e.
func (f Field) value(e *event.Event) string {
	switch f {
	case FieldID:
		return e.ID
	case FieldAggregateType:
		return e.AggregateType
	case FieldAggregateID:
		return e.AggregateID
	case FieldEventType:
		return e.EventType
	}
	return e.Key()
}

// Placement puts one more field of each event in the message, as the
// router's table.fields.additional.placement does.
type Placement struct {
	Field Field
	// Envelope places the field in the value's envelope object; otherwise
	// it is a header.
	Envelope bool
	// Name is the header or envelope field name: the alias, or the column
	// name without one.
	Name string
}

// Options configure a Format. The zero value is the router's default
// shape with JSON converters.
type Options struct {
	// ExpandJSON publishes a payload that is a JSON object as JSON rather
	// than as a JSON string (table.expand.json.payload). Requires the JSON
	// value converter.
	ExpandJSON bool
	// Placements are the additional fields, in order.
	Placements []Placement
	// StringKey publishes the key as it is (StringConverter); default: as
	// a JSON string (JsonConverter).
	StringKey bool
	// StringValue publishes the payload bytes as they are
	// (StringConverter, BinaryDataConverter); default: JSON
	// (JsonConverter). Envelope placements require JSON.
	StringValue bool
}

// Format shapes events. Its methods are safe for concurrent use.
type Format struct {
	opts     Options
	envelope bool // some placement is an envelope field
}

// New returns the Format of o. It fails when o asks for JSON (ExpandJSON,
// an envelope placement) with the string value converter, or when two
// placements of one kind share a name, or an envelope field is named
// payload.
func New(o Options) (*Format, error) {
	f := &Format{opts: o}
	seen := map[string]bool{}
	for _, p := range o.Placements {
		kind := "header"
		if p.Envelope {
			kind, f.envelope = "envelope", true
		}
		switch {
		case p.Name == "":
			return nil, fmt.Errorf("a %s placement needs a name", kind)
		case p.Envelope && p.Name == "payload":
			return nil, errors.New(`an envelope field cannot be named "payload": the envelope holds the payload under that name`)
		case !p.Envelope && strings.EqualFold(p.Name, "id"):
			return nil, errors.New(`a header cannot be named "id": that header holds the event id`)
		case seen[kind+"\x00"+p.Name]:
			return nil, fmt.Errorf("two %s placements are named %q", kind, p.Name)
		}
		seen[kind+"\x00"+p.Name] = true
	}
	if o.StringValue && (o.ExpandJSON || f.envelope) {
		return nil, errors.New("expanding the JSON payload and envelope placements need the json value converter")
	}
	return f, nil
}

// Batch returns batch with every event shaped (see Shape), in order. The
// events of batch are not changed.
func (f *Format) Batch(batch []*event.Event) []*event.Event {
	out := make([]*event.Event, len(batch))
	for i, e := range batch {
		out[i] = f.Shape(e)
	}
	return out
}

// Shape returns a copy of e as the router publishes it: key, headers and
// payload as the package comment says. The destination fields
// (AggregateType, AggregateID, EventType, ID) are unchanged, so e and its
// copy go to the same destination.
func (f *Format) Shape(e *event.Event) *event.Event {
	c := *e
	if !f.opts.StringKey {
		c.OrderKey = string(quote(nil, e.Key()))
	}
	c.Headers = f.headers(e)
	if !f.opts.StringValue {
		c.Payload, c.ContentType = f.value(e), event.ContentTypeJSON
	}
	return &c
}

// headers returns e's row headers without those the format sets (any case
// of their names), then the id header and the header placements.
func (f *Format) headers(e *event.Event) map[string]string {
	h := make(map[string]string, len(e.Headers)+1+len(f.opts.Placements))
	for k, v := range e.Headers {
		if !f.setsHeader(k) {
			h[k] = v
		}
	}
	h["id"] = e.ID
	for _, p := range f.opts.Placements {
		if !p.Envelope {
			h[p.Name] = p.Field.value(e)
		}
	}
	return h
}

// setsHeader reports whether the format sets a header named name, in any
// case: a row header of that name would shadow it.
func (f *Format) setsHeader(name string) bool {
	if strings.EqualFold(name, "id") {
		return true
	}
	for _, p := range f.opts.Placements {
		if !p.Envelope && strings.EqualFold(name, p.Name) {
			return true
		}
	}
	return false
}

// value returns e's value with the JSON value converter: the payload, in
// the envelope when there are envelope placements.
func (f *Format) value(e *event.Event) []byte {
	if !f.envelope {
		return f.payload(nil, e)
	}
	b := f.payload(append(make([]byte, 0, len(e.Payload)+64), `{"payload":`...), e)
	for _, p := range f.opts.Placements {
		if p.Envelope {
			b = append(quote(append(b, ','), p.Name), ':')
			b = quote(b, p.Field.value(e))
		}
	}
	return append(b, '}')
}

// payload appends e's payload as JSON: a bytea payload as a base64 string
// (the JsonConverter's bytes), an expanded document when ExpandJSON is set
// and the payload expands, and a JSON string otherwise.
func (f *Format) payload(b []byte, e *event.Event) []byte {
	if e.ContentType == event.ContentTypeBinary {
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, e.Payload)
		return append(b, '"')
	}
	if f.opts.ExpandJSON {
		if doc, ok := expand(e.Payload); ok {
			return append(b, doc...)
		}
	}
	return quote(b, string(e.Payload))
}

// quote appends s as a JSON string, escaped as Jackson (the JsonConverter's
// writer) escapes by default: '"', '\\' and the control characters below
// U+0020, those with a short form (\b \t \n \f \r) in it and the others as
// \u00XX; everything else as it is.
func quote(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, `\b`...)
		case '\t':
			b = append(b, `\t`...)
		case '\n':
			b = append(b, `\n`...)
		case '\f':
			b = append(b, `\f`...)
		case '\r':
			b = append(b, `\r`...)
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

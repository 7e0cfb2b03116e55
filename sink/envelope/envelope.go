// Package envelope wraps events in the CloudEvents 1.0 envelope that
// sink.envelope: cloudevents selects. The sinks call it while building a
// message; with no envelope they never do, so it costs nothing per event.
//
// The attributes of an event: specversion 1.0, id the message_id, source
// the configured prefix joined with the aggregate_type (see Source), type
// the event_type, subject the aggregate_id, time the created_at (RFC 3339,
// UTC), datacontenttype the payload's content type, and traceparent and
// tracestate (the distributed tracing extension) copied from the row's
// headers of those names. Kafka, NATS and the webhook carry them in binary
// content mode (Binary), SQS in structured content mode (Structured); the
// mapping per sink is in docs/configuration.md, CloudEvents.
package envelope

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// SpecVersion is the CloudEvents version of every envelope.
const SpecVersion = "1.0"

// StructuredContentType is the content type of a structured-mode message:
// the JSON event format.
const StructuredContentType = "application/cloudevents+json; charset=UTF-8"

// The row headers that become the distributed tracing extension.
const (
	traceParent = "traceparent"
	traceState  = "tracestate"
)

// CloudEvents builds the envelope of events. Its methods are safe for
// concurrent use.
type CloudEvents struct {
	prefix string // the source prefix with the separator to the aggregate_type
}

// New returns the envelope whose source attribute is source joined with
// each event's aggregate_type. It fails when CheckSource does.
func New(source string) (*CloudEvents, error) {
	if err := CheckSource(source); err != nil {
		return nil, err
	}
	sep := "/"
	if strings.HasSuffix(source, "/") || strings.HasSuffix(source, ":") {
		sep = ""
	}
	return &CloudEvents{prefix: source + sep}, nil
}

// CheckSource fails unless source can be the prefix of a source attribute:
// a URI reference (absolute like urn:example:orders or
// https://example.com/orders, or relative like /orders) without query,
// fragment or whitespace.
func CheckSource(source string) error {
	u, err := url.Parse(source)
	switch {
	case source == "":
		return errors.New("must not be empty")
	case strings.ContainsFunc(source, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return errors.New("must not contain whitespace or control characters")
	case err != nil:
		return fmt.Errorf("is not a URI reference: %v", errors.Unwrap(err))
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(source, "#"):
		return errors.New("must not have a query or fragment: the aggregate_type is appended to it")
	}
	return nil
}

// Source returns the source attribute of e: the prefix, then "/" unless
// the prefix ends in "/" or ":", then the aggregate_type percent-encoded
// as a URI path segment. With prefix urn:example:orders and aggregate_type
// order it is urn:example:orders/order.
func (c *CloudEvents) Source(e *event.Event) string {
	return c.prefix + url.PathEscape(e.AggregateType)
}

// Check fails, with a fault.Permanent error, when e cannot be a valid
// CloudEvent: its event_type is empty, or the event_type or aggregate_id
// is not UTF-8 or has a character CloudEvents forbids in attribute values
// (U+0000-U+001F, U+007F-U+009F).
func (c *CloudEvents) Check(e *event.Event) error {
	switch {
	case e.EventType == "":
		return fault.AsPermanent(errors.New("event_type is empty: a CloudEvent needs a type"))
	case strings.ContainsFunc(e.EventType, forbidden):
		return fault.AsPermanent(errors.New("event_type has a control character, which a CloudEvent type cannot hold"))
	case strings.ContainsFunc(e.AggregateID, forbidden):
		return fault.AsPermanent(errors.New("aggregate_id has a control character, which a CloudEvent subject cannot hold"))
	case !utf8.ValidString(e.EventType) || !utf8.ValidString(e.AggregateID):
		return fault.AsPermanent(errors.New("event_type or aggregate_id is not valid UTF-8, which CloudEvent attributes must be"))
	}
	return nil
}

// forbidden reports whether CloudEvents forbids r in attribute values.
func forbidden(r rune) bool { return r <= 0x1f || r >= 0x7f && r <= 0x9f }

// The attributes Binary sets, in order.
const (
	attrSpecVersion = iota
	attrID
	attrSource
	attrType
	attrSubject
	attrTime
	attrDataContentType
	attrTraceParent
	attrTraceState
	numAttrs
)

var attrNames = [numAttrs]string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", traceParent, traceState}

// Binding says how a protocol binding carries the attributes in binary
// content mode.
type Binding struct {
	prefix string
	// names are the header names of the attributes: prefix and name.
	names [numAttrs]string
	// percent: values are percent-encoded (HTTP and NATS bindings).
	percent bool
	// dataContentType: datacontenttype is a prefixed header too (NATS);
	// otherwise the sink's content-type header carries it.
	dataContentType bool
}

func newBinding(prefix string, percent, dataContentType bool) *Binding {
	b := &Binding{prefix: prefix, percent: percent, dataContentType: dataContentType}
	for i, name := range attrNames {
		b.names[i] = prefix + name
	}
	return b
}

// The bindings of the binary content mode.
var (
	// Kafka: ce_ headers with the values as they are; the content-type
	// header is the datacontenttype.
	Kafka = newBinding("ce_", false, false)
	// HTTP: ce- headers with percent-encoded values; Content-Type is the
	// datacontenttype.
	HTTP = newBinding("ce-", true, false)
	// NATS: ce- headers with percent-encoded values, datacontenttype
	// included as ce-datacontenttype.
	NATS = newBinding("ce-", true, true)
	// AMQP: cloudEvents: application properties with the values as they
	// are; the content_type property is the datacontenttype.
	AMQP = newBinding("cloudEvents:", false, false)
)

// ReservedPrefix returns the prefix of the header names the envelope c
// sets in binding b, such as "ce-", which a row header cannot use; "" when
// c is nil (no envelope).
func (b *Binding) ReservedPrefix(c *CloudEvents) string {
	if c == nil {
		return ""
	}
	return b.prefix
}

// Owns reports whether a header name is in the binding's namespace (it
// starts with the prefix, in any case). The envelope owns that namespace:
// the sinks do not forward a row header there.
func (b *Binding) Owns(name string) bool {
	return len(name) >= len(b.prefix) && strings.EqualFold(name[:len(b.prefix)], b.prefix)
}

// Binary calls set with each attribute of e as a header of binding b: the
// name with b's prefix, the value encoded as b requires. Optional
// attributes without a value are left out.
func (c *CloudEvents) Binary(e *event.Event, b *Binding, set func(name, value string)) {
	put := func(attr int, value string) {
		if value == "" {
			return
		}
		if b.percent {
			value = PercentEncode(value)
		}
		set(b.names[attr], value)
	}
	put(attrSpecVersion, SpecVersion)
	put(attrID, e.ID)
	put(attrSource, c.Source(e))
	put(attrType, e.EventType)
	put(attrSubject, e.AggregateID)
	put(attrTime, timeOf(e))
	if b.dataContentType {
		put(attrDataContentType, e.ContentType)
	}
	put(attrTraceParent, e.Headers[traceParent])
	put(attrTraceState, e.Headers[traceState])
}

// timeOf returns e's created_at in RFC 3339, or "" when it is not set.
func timeOf(e *event.Event) string {
	if e.CreatedAt.IsZero() {
		return ""
	}
	return e.CreatedAt.UTC().Format(time.RFC3339Nano)
}

// PercentEncode encodes v as the HTTP and NATS bindings require: space,
// '"', '%', and every byte outside printable ASCII becomes %XY.
func PercentEncode(v string) string {
	n := 0
	for i := 0; i < len(v); i++ {
		if needsPercent(v[i]) {
			n++
		}
	}
	if n == 0 {
		return v
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(v)+2*n)
	for i := 0; i < len(v); i++ {
		if c := v[i]; needsPercent(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func needsPercent(c byte) bool { return c <= ' ' || c >= 0x7f || c == '"' || c == '%' }

// structured is the JSON event format of one event.
type structured struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	TraceParent     string          `json:"traceparent,omitempty"`
	TraceState      string          `json:"tracestate,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      string          `json:"data_base64,omitempty"`
}

// Structured returns e in the JSON event format, the body of a
// structured-mode message (its content type is StructuredContentType). The
// payload is data as it is when it is JSON (a json or jsonb column), data
// as a JSON string when it is UTF-8 text, and data_base64 otherwise (bytea,
// or a payload that does not match its content type). An empty payload
// leaves data out.
func (c *CloudEvents) Structured(e *event.Event) []byte {
	s := structured{
		SpecVersion: SpecVersion, ID: e.ID, Source: c.Source(e), Type: e.EventType,
		Subject: e.AggregateID, Time: timeOf(e), DataContentType: e.ContentType,
		TraceParent: e.Headers[traceParent], TraceState: e.Headers[traceState],
	}
	switch p := e.Payload; {
	case len(p) == 0:
	case e.ContentType == event.ContentTypeJSON && json.Valid(p):
		s.Data = p
	case e.ContentType == event.ContentTypeText && utf8.Valid(p):
		s.Data, _ = json.Marshal(string(p))
	default:
		s.DataBase64 = base64.StdEncoding.EncodeToString(p)
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // strings and valid JSON only: cannot fail
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

// Package envelopetest reads the CloudEvents that the sinks publish the way
// a consumer would, with the CloudEvents Go SDK, and compares them with the
// events they came from. Tests only: the relay never imports it.
//
// HTTP and NATS messages go through the SDK's own bindings, after the
// single round of percent-decoding the HTTP and NATS bindings prescribe
// (the SDK leaves that to the caller). Kafka messages go through a reader
// that follows the Kafka binding with the SDK's attribute tables; the
// SDK's Kafka bindings need sarama or librdkafka. SQS bodies are read with
// the SDK's JSON event format.
package envelopetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	cenats "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	ce "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink/envelope"
)

// FromHTTP reads the binary-mode CloudEvent of a webhook request.
func FromHTTP(h http.Header, body []byte) (*ce.Event, error) {
	h, err := decoded(h, "Ce-")
	if err != nil {
		return nil, err
	}
	return read(cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body))), binding.EncodingBinary)
}

// FromNATS reads the binary-mode CloudEvent of a NATS message.
func FromNATS(h nats.Header, data []byte) (*ce.Event, error) {
	h2, err := decoded(http.Header(h), "ce-")
	if err != nil {
		return nil, err
	}
	return read(cenats.NewMessage(&nats.Msg{Header: nats.Header(h2), Data: data}), binding.EncodingBinary)
}

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// FromKafka reads the binary-mode CloudEvent of a Kafka record.
func FromKafka(headers []Header, value []byte) (*ce.Event, error) {
	return read(&kafkaMessage{headers: headers, value: value}, binding.EncodingBinary)
}

// FromStructured reads a CloudEvent in the JSON event format, the body of
// an SQS message.
func FromStructured(body []byte) (*ce.Event, error) {
	var ev ce.Event
	if err := format.JSON.Unmarshal(body, &ev); err != nil {
		return nil, err
	}
	return &ev, ev.Validate()
}

// Of returns the event of events with id, or nil.
func Of(events []*event.Event, id string) *event.Event {
	for _, e := range events {
		if e.ID == id {
			return e
		}
	}
	return nil
}

// read converts m, which must be in the encoding want, and validates it.
func read(m binding.MessageReader, want binding.Encoding) (*ce.Event, error) {
	if got := m.ReadEncoding(); got != want {
		return nil, fmt.Errorf("message encoding %s, want %s", got, want)
	}
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return nil, err
	}
	return ev, ev.Validate()
}

// decoded returns h with the values of the headers whose name starts with
// prefix (in any case) percent-decoded, rejecting invalid UTF-8.
func decoded(h http.Header, prefix string) (http.Header, error) {
	out := make(http.Header, len(h))
	for k, vs := range h {
		out[k] = vs
		if len(k) < len(prefix) || !strings.EqualFold(k[:len(prefix)], prefix) {
			continue
		}
		v, err := url.PathUnescape(vs[0])
		if err != nil || !utf8.ValidString(v) {
			return nil, fmt.Errorf("header %s: %q is not percent-encoded UTF-8", k, vs[0])
		}
		out[k] = []string{v}
	}
	return out, nil
}

// kafkaSpecs are the attribute names of the Kafka binding.
var kafkaSpecs = spec.WithPrefix("ce_")

// kafkaMessage reads a record as the Kafka binding says: ce_ headers are
// attributes (unknown ones extensions), content-type is datacontenttype,
// the value is data.
type kafkaMessage struct {
	headers []Header
	value   []byte
}

func (m *kafkaMessage) version() spec.Version {
	for _, h := range m.headers {
		if h.Key == kafkaSpecs.PrefixedSpecVersionName() {
			return kafkaSpecs.Version(string(h.Value))
		}
	}
	return nil
}

func (m *kafkaMessage) ReadEncoding() binding.Encoding {
	if m.version() != nil {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *kafkaMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m *kafkaMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if v == nil {
		return binding.ErrNotBinary
	}
	for _, h := range m.headers {
		var err error
		switch attr := v.Attribute(h.Key); {
		case h.Key == "content-type":
			err = w.SetAttribute(v.AttributeFromKind(spec.DataContentType), string(h.Value))
		case attr != nil:
			err = w.SetAttribute(attr, string(h.Value))
		case strings.HasPrefix(h.Key, "ce_"):
			err = w.SetExtension(strings.TrimPrefix(h.Key, "ce_"), string(h.Value))
		}
		if err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.value))
}

func (m *kafkaMessage) Finish(error) error { return nil }

func (m *kafkaMessage) header(key string) (string, bool) {
	for _, h := range m.headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func (m *kafkaMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	key := attr.PrefixedName()
	if k == spec.DataContentType {
		key = "content-type"
	}
	if value, ok := m.header(key); ok {
		return attr, value
	}
	return attr, nil
}

func (m *kafkaMessage) GetExtension(name string) any {
	if value, ok := m.header("ce_" + name); ok {
		return value
	}
	return nil
}

// Source is the sink.cloudevents.source of the sink tests.
const Source = "urn:example:orders"

// New returns the envelope of Source.
func New() *envelope.CloudEvents {
	env, err := envelope.New(Source)
	if err != nil {
		panic(err)
	}
	return env
}

// Events returns events for the sink tests, of aggregate_type order (source
// urn:example:orders/order): a JSON payload with the tracing headers and
// row headers that try to set attributes of every binding (ce-id, CE-Type,
// ce_source, Ce-Extra; the sinks must drop those in their own namespace),
// a text payload whose aggregate_id needs percent-encoding, and a bytea
// payload.
func Events() []*event.Event {
	at := time.Date(2026, 12, 1, 7, 30, 0, 123456000, time.UTC)
	return []*event.Event{
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1, "b": [true]}`), ContentType: event.ContentTypeJSON,
			CreatedAt: at,
			Headers: map[string]string{
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v",
				"trace_id": "t-1", "ce-id": "spoofed", "CE-Type": "spoofed", "ce_source": "spoofed", "Ce-Extra": "spoofed",
			},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f61", AggregateType: "order", AggregateID: "Zoë 2",
			EventType: "order.noted", Payload: []byte("a note, \"quoted\""), ContentType: event.ContentTypeText,
			CreatedAt: at.Add(time.Second),
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f62", AggregateType: "order", AggregateID: "o-3",
			EventType: "order.scanned", Payload: []byte{0, 1, 2, 0xfe, 0xff}, ContentType: event.ContentTypeBinary,
			CreatedAt: at.Add(2 * time.Second),
		},
	}
}

// Match compares the CloudEvent got with the event e it was published from
// under the source prefix source (already joined as the relay does it, e.g.
// "urn:example:orders/order"): every attribute, the data, and the
// traceparent and tracestate extensions.
func Match(got *ce.Event, e *event.Event, source string) error {
	var errs []error
	check := func(name string, got, want any) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s %q, want %q", name, got, want))
		}
	}
	check("specversion", got.SpecVersion(), "1.0")
	check("id", got.ID(), e.ID)
	check("source", got.Source(), source)
	check("type", got.Type(), e.EventType)
	check("subject", got.Subject(), e.AggregateID)
	check("datacontenttype", got.DataContentType(), e.ContentType)
	if !got.Time().Equal(e.CreatedAt) {
		errs = append(errs, fmt.Errorf("time %s, want %s", got.Time(), e.CreatedAt))
	}
	for name, v := range got.Extensions() {
		ext, _ := v.(string)
		check("extension "+name, ext, e.Headers[name])
	}
	for _, name := range []string{"traceparent", "tracestate"} {
		ext, _ := got.Extensions()[name].(string)
		check(name, ext, e.Headers[name])
	}
	if !sameData(got.Data(), e.Payload, e.ContentType) {
		errs = append(errs, fmt.Errorf("data %q, want %q", got.Data(), e.Payload))
	}
	return errors.Join(errs...)
}

// sameData compares data as JSON values when it is JSON, else byte for
// byte.
func sameData(got, want []byte, contentType string) bool {
	if contentType != event.ContentTypeJSON || !json.Valid(want) {
		return bytes.Equal(got, want)
	}
	var g, w any
	return json.Unmarshal(got, &g) == nil && json.Unmarshal(want, &w) == nil && reflect.DeepEqual(g, w)
}

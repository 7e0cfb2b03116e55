package envelope_test

import (
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	ce "github.com/cloudevents/sdk-go/v2/event"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

func testEvent() *event.Event {
	return &event.Event{
		ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
		EventType: "order.created", Payload: []byte(`{"a": 1, "b": [true]}`), ContentType: event.ContentTypeJSON,
		CreatedAt: time.Date(2026, 12, 1, 7, 30, 0, 123456000, time.FixedZone("CET", 3600)),
		Headers:   map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v"},
	}
}

func newEnvelope(t *testing.T, source string) *envelope.CloudEvents {
	t.Helper()
	env, err := envelope.New(source)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestSourceJoinsPrefixAndAggregateType(t *testing.T) {
	for _, c := range []struct{ prefix, aggregateType, want string }{
		{"urn:example:orders", "order", "urn:example:orders/order"},
		{"urn:example:", "order", "urn:example:order"},
		{"https://example.com/shop/", "order", "https://example.com/shop/order"},
		{"/shop", "order line/v2", "/shop/order%20line%2Fv2"},
		{"urn:example:orders", "", "urn:example:orders/"},
	} {
		e := &event.Event{AggregateType: c.aggregateType}
		if got := newEnvelope(t, c.prefix).Source(e); got != c.want {
			t.Errorf("prefix %q, aggregate_type %q: source %q, want %q", c.prefix, c.aggregateType, got, c.want)
		}
	}
}

func TestCheckSource(t *testing.T) {
	for _, ok := range []string{"urn:example:orders", "https://example.com/orders", "/orders", "orders"} {
		if err := envelope.CheckSource(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "urn:a b", "https://example.com/?x=1", "urn:a#frag", "http://[::1", "%zz"} {
		if err := envelope.CheckSource(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestPercentEncode uses the example of the HTTP and NATS bindings.
func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"Euro € 😀":         "Euro%20%E2%82%AC%20%F0%9F%98%80",
		`a"b%c`:            "a%22b%25c",
		"urn:x/order-1_~!": "urn:x/order-1_~!",
		"tab\tdel\x7f":     "tab%09del%7F",
	} {
		if got := envelope.PercentEncode(in); got != want {
			t.Errorf("PercentEncode(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBinaryReadBySDK reads the headers of each binding back with the
// CloudEvents SDK: every attribute arrives, values with spaces and
// non-ASCII characters included, and nothing else is named like one.
func TestBinaryReadBySDK(t *testing.T) {
	env := newEnvelope(t, "urn:example:orders")
	e := testEvent()
	e.AggregateID = "Zoë 1/\"2\"" // needs percent-encoding in HTTP and NATS
	e.EventType = "order.créé"

	kafka := []envelopetest.Header{{Key: "content-type", Value: []byte(e.ContentType)}}
	env.Binary(e, envelope.Kafka, func(k, v string) { kafka = append(kafka, envelopetest.Header{Key: k, Value: []byte(v)}) })
	httpH := http.Header{"Content-Type": {e.ContentType}}
	env.Binary(e, envelope.HTTP, func(k, v string) { httpH.Add(k, v) })
	natsH := map[string][]string{}
	env.Binary(e, envelope.NATS, func(k, v string) { natsH[k] = []string{v} })

	want := []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-time", "ce-datacontenttype", "ce-traceparent", "ce-tracestate"}
	if got := slices.Sorted(maps.Keys(natsH)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("NATS headers %v, want %v", got, want)
	}
	for _, h := range kafka[1:] {
		if strings.Contains(string(h.Value), "%") {
			t.Errorf("Kafka header %s=%q is percent-encoded; the Kafka binding carries UTF-8 as it is", h.Key, h.Value)
		}
	}

	fromKafka, err := envelopetest.FromKafka(kafka, e.Payload)
	check(t, "kafka", fromKafka, err, e)
	fromHTTP, err := envelopetest.FromHTTP(httpH, e.Payload)
	check(t, "http", fromHTTP, err, e)
	fromNATS, err := envelopetest.FromNATS(natsH, e.Payload)
	check(t, "nats", fromNATS, err, e)
}

// TestStructuredReadBySDK reads the JSON event format of each kind of
// payload back with the SDK.
func TestStructuredReadBySDK(t *testing.T) {
	env := newEnvelope(t, "urn:example:orders")
	for name, p := range map[string]struct {
		payload     []byte
		contentType string
	}{
		"json":          {[]byte(`{"a": 1, "s": "<&>"}`), event.ContentTypeJSON},
		"text":          {[]byte("plain \"text\" ü\n"), event.ContentTypeText},
		"bytea":         {[]byte{0, 1, 2, 0xff}, event.ContentTypeBinary},
		"empty":         {nil, event.ContentTypeJSON},
		"invalid json":  {[]byte(`{"a":`), event.ContentTypeJSON},
		"invalid utf-8": {[]byte{'a', 0xff}, event.ContentTypeText},
	} {
		e := testEvent()
		e.Payload, e.ContentType = p.payload, p.contentType
		got, err := envelopetest.FromStructured(env.Structured(e))
		check(t, name, got, err, e)
	}
}

// TestNoTimeNoSubject leaves optional attributes without a value out.
func TestNoTimeNoSubject(t *testing.T) {
	env := newEnvelope(t, "urn:x")
	e := testEvent()
	e.CreatedAt, e.AggregateID, e.Headers = time.Time{}, "", nil
	h := map[string]string{}
	env.Binary(e, envelope.Kafka, func(k, v string) { h[k] = v })
	for _, k := range []string{"ce_time", "ce_subject", "ce_traceparent", "ce_tracestate"} {
		if _, ok := h[k]; ok {
			t.Errorf("%s set for an empty value", k)
		}
	}
	if _, err := envelopetest.FromStructured(env.Structured(e)); err != nil {
		t.Error(err)
	}
}

func TestCheckRejectsWhatCannotBeACloudEvent(t *testing.T) {
	env := newEnvelope(t, "urn:x")
	if err := env.Check(testEvent()); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*event.Event){
		"empty type":            func(e *event.Event) { e.EventType = "" },
		"control in type":       func(e *event.Event) { e.EventType = "a\nb" },
		"control in id":         func(e *event.Event) { e.AggregateID = "a\x00" },
		"invalid UTF-8 in type": func(e *event.Event) { e.EventType = "bad\xff" },
		"invalid UTF-8 in id":   func(e *event.Event) { e.AggregateID = "\xc3(" },
	} {
		e := testEvent()
		mutate(e)
		if err := env.Check(e); fault.ClassOf(err) != fault.Permanent {
			t.Errorf("%s: %v, want a permanent error", name, err)
		}
	}
}

func TestOwns(t *testing.T) {
	for _, c := range []struct {
		b    *envelope.Binding
		name string
		want bool
	}{
		{envelope.Kafka, "ce_id", true}, {envelope.Kafka, "CE_Foo", true}, {envelope.Kafka, "ce-id", false},
		{envelope.HTTP, "Ce-Id", true}, {envelope.HTTP, "ce", false}, {envelope.NATS, "ce-source", true},
		{envelope.NATS, "content-type", false},
	} {
		if got := c.b.Owns(c.name); got != c.want {
			t.Errorf("Owns(%q) = %v", c.name, got)
		}
	}
}

func check(t *testing.T, name string, got *ce.Event, err error, e *event.Event) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: the SDK rejects the event: %v", name, err)
		return
	}
	if err := envelopetest.Match(got, e, "urn:example:orders/order"); err != nil {
		t.Errorf("%s: %v", name, err)
	}
}

func BenchmarkBinary(b *testing.B) {
	env, e := newEnvelopeB(b), testEvent()
	b.ReportAllocs()
	for b.Loop() {
		env.Binary(e, envelope.NATS, func(string, string) {})
	}
}

func BenchmarkStructured(b *testing.B) {
	env, e := newEnvelopeB(b), testEvent()
	b.ReportAllocs()
	for b.Loop() {
		env.Structured(e)
	}
}

func newEnvelopeB(b *testing.B) *envelope.CloudEvents {
	env, err := envelope.New("urn:example:orders")
	if err != nil {
		b.Fatal(err)
	}
	return env
}

package debezium

import (
	"maps"
	"slices"
	"testing"

	"github.com/outboxrelay/relay/event"
)

func testEvent(payload, contentType string) *event.Event {
	return &event.Event{ID: "4d47e190-0402-4048-bc2c-89dd54343cdc", AggregateType: "order", AggregateID: "1",
		EventType: "OrderCreated", Payload: []byte(payload), ContentType: contentType,
		Headers: map[string]string{"traceparent": "00-x", "ID": "row's own", "EventType": "row's"}}
}

// TestShapeValue pins the value bytes of the router's documented messages
// (Debezium's outbox-event-router.adoc: "Example outbox message" and
// "Expanding escaped JSON String as JSON") and of the converters.
func TestShapeValue(t *testing.T) {
	t.Parallel()
	const doc = `{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}`
	for _, tc := range []struct {
		name    string
		opts    Options
		payload string
		ctype   string
		want    string
	}{
		{"json string", Options{}, doc, event.ContentTypeJSON,
			`"{\"id\": 1, \"lineItems\": [{\"id\": 1, \"item\": \"Debezium in Action\", \"status\": \"ENTERED\", \"quantity\": 2, \"totalPrice\": 39.98}], \"orderDate\": \"2019-01-31T12:13:01\", \"customerId\": 123}"`},
		{"expanded", Options{ExpandJSON: true}, doc, event.ContentTypeJSON,
			`{"id":1,"lineItems":[{"id":1,"item":"Debezium in Action","status":"ENTERED","quantity":2,"totalPrice":39.98}],"orderDate":"2019-01-31T12:13:01","customerId":123}`},
		{"text escapes", Options{}, "a\"b\\c\n\t\x01é\u2028", event.ContentTypeText, `"a\"b\\c\n\t\u0001é` + "\u2028" + `"`},
		{"text not json stays a string", Options{ExpandJSON: true}, "hello", event.ContentTypeText, `"hello"`},
		{"leading space is not expanded", Options{ExpandJSON: true}, ` {"a":1}`, event.ContentTypeText, `" {\"a\":1}"`},
		{"broken json stays a string", Options{ExpandJSON: true}, `{"a":`, event.ContentTypeText, `"{\"a\":"`},
		{"bytea is base64", Options{ExpandJSON: true}, "\x00\xff", event.ContentTypeBinary, `"AP8="`},
		{"string converter", Options{StringValue: true}, doc, event.ContentTypeJSON, doc},
		{"envelope", Options{Placements: []Placement{{Field: FieldEventType, Envelope: true, Name: "eventType"},
			{Field: FieldAggregateType, Envelope: true, Name: "aggregate\"type"}}}, `{"a": 1}`, event.ContentTypeJSON,
			`{"payload":"{\"a\": 1}","eventType":"OrderCreated","aggregate\"type":"order"}`},
		{"envelope expanded", Options{ExpandJSON: true, Placements: []Placement{{Field: FieldID, Envelope: true, Name: "eventId"}}},
			`{"a": 1}`, event.ContentTypeJSON, `{"payload":{"a":1},"eventId":"4d47e190-0402-4048-bc2c-89dd54343cdc"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := New(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got := f.Shape(testEvent(tc.payload, tc.ctype))
			if string(got.Payload) != tc.want {
				t.Errorf("value\n got %s\nwant %s", got.Payload, tc.want)
			}
		})
	}
}

// TestExpand pins how the router's schema inference treats what is not a
// plain document (JsonSchemaData in Debezium), with the cases of
// Debezium's own EventRouterTest and JsonSchemaDataTest among them.
func TestExpand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"fullName": "John Doe", "enabled": true, "rating": 4.9, "age": 42, "pets": ["dog", "cat"], "petObjects": [{"type": "dog"}, {"type": "cat"}]}`,
			`{"fullName":"John Doe","enabled":true,"rating":4.9,"age":42,"pets":["dog","cat"],"petObjects":[{"type":"dog"},{"type":"cat"}]}`},
		{`{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}, {"type": "cat", "colors": [{"name": "white"}]}]}`,
			`{"fullName":"John Doe","petObjects":[{"type":"dog","colors":[]},{"type":"cat","colors":[{"name":"white"}]}]}`},
		{`{"fullName": "John Doe", "petObjects": [{"type": "dog", "colors": []}]}`, `{"fullName":"John Doe","petObjects":[{"type":"dog"}]}`},
		{`{"fullName": "John Doe", "numbers": [null, 2, 3]}`, `{"fullName":"John Doe","numbers":[null,2,3]}`},
		{`{"arr": [{"code":"100","description": null},{"code":"200","description":"another description"},{"code":"300"}]}`,
			`{"arr":[{"code":"100","description":null},{"code":"200","description":"another description"},{"code":"300","description":null}]}`},
		{`{"a": null, "e": [], "b": {"c": null, "d": true}}`, `{"b":{"d":true}}`},
		{`{"a": 1, "b": 2, "a": 3}`, `{"a":3,"b":2}`},
		{`{"big": 3000000000, "f": 1e2, "s": "\u00e9\n"}`, `{"big":3000000000,"f":1e2,"s":"é\n"}`},
		{`{"a": 1} trailing`, `{"a":1}`},
		// The router fails these and keeps the payload a string.
		{`[1, 2]`, ""},
		{`{"m": [1, "x"]}`, ""},
		{`{"m": [1, 2.5]}`, ""},
		{`{"m": [1, 3000000000]}`, ""},
		{`{"m": [null, null]}`, ""},
		{`{"m": [[], [1]]}`, ""},
		{`{"m": [{"x": 1}, {"x": "s"}]}`, ""},
		{`{"m": 12345678901234567890}`, ""},
		{`{"m": 1`, ""},
	} {
		got, ok := expand([]byte(tc.in))
		if tc.want == "" && ok || tc.want != "" && string(got) != tc.want {
			t.Errorf("expand(%s) = %s, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

// TestShapeHeadersKey checks the id header, the header placements over
// row headers of those names, the key converters, and that the event
// shaped is left as it was.
func TestShapeHeadersKey(t *testing.T) {
	t.Parallel()
	f, err := New(Options{Placements: []Placement{{Field: FieldEventType, Name: "eventType"}, {Field: FieldAggregateID, Name: "agg"}}})
	if err != nil {
		t.Fatal(err)
	}
	e := testEvent(`{}`, event.ContentTypeJSON)
	before := maps.Clone(e.Headers)
	got := f.Shape(e)
	want := map[string]string{"traceparent": "00-x", "id": e.ID, "eventType": "OrderCreated", "agg": "1"}
	if !maps.Equal(got.Headers, want) {
		t.Errorf("headers %v, want %v", got.Headers, want)
	}
	if got.Key() != `"1"` || got.AggregateID != "1" || got.AggregateType != "order" || got.ID != e.ID {
		t.Errorf("key %q, aggregate %q/%q", got.Key(), got.AggregateType, got.AggregateID)
	}
	if !maps.Equal(e.Headers, before) || string(e.Payload) != `{}` || e.OrderKey != "" {
		t.Errorf("the event was changed: %+v", e)
	}
	e.OrderKey = "tenant-7"
	s, _ := New(Options{StringKey: true, StringValue: true})
	if got := s.Shape(e); got.Key() != "tenant-7" || string(got.Payload) != `{}` || got.ContentType != event.ContentTypeJSON {
		t.Errorf("string converters: key %q, value %s", got.Key(), got.Payload)
	}
}

// TestNewRefuses checks the options New refuses.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{StringValue: true, ExpandJSON: true},
		{StringValue: true, Placements: []Placement{{Envelope: true, Name: "t"}}},
		{Placements: []Placement{{Envelope: true, Name: "payload"}}},
		{Placements: []Placement{{Name: "Id"}}},
		{Placements: []Placement{{Name: "t"}, {Field: FieldID, Name: "t"}}},
		{Placements: []Placement{{Name: ""}}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// TestParsePlacements checks Debezium's syntax, a comma list split over
// items, and the refusals.
func TestParsePlacements(t *testing.T) {
	t.Parallel()
	cols := map[string]Field{"id": FieldID, "aggregatetype": FieldAggregateType, "type": FieldEventType}
	got, err := ParsePlacements([]string{"type:header:eventType, aggregatetype:envelope", "id:header:eventId"}, cols)
	want := []Placement{{Field: FieldEventType, Name: "eventType"}, {Field: FieldAggregateType, Envelope: true, Name: "aggregatetype"},
		{Field: FieldID, Name: "eventId"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"type", "type:header:a:b", "payload:header", "type:partition", "type:body", "type:header:", ":header"} {
		if _, err := ParsePlacements([]string{bad}, cols); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

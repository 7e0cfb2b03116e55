package sqs

import (
	"encoding/json"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// FuzzMessageAttributes builds messages of events with arbitrary row
// headers, aggregate id and payload: the contract attributes are set once
// with the event's values, no row header named like the relay's or
// reserved by SQS is sent, a message has at most SQS's 10 attributes, each
// with a name SQS accepts and a String value only of text SQS can carry,
// and every other row header arrives with its value: as an attribute of
// its own, or in the "headers" attribute's JSON, a String.
func FuzzMessageAttributes(f *testing.F) {
	f.Add("tenant", "t1", "AWS.Trace", "x", "a1", []byte(`{}`))
	f.Add("Message_ID", "evil", "body_encoding", "x", "a1", []byte{0xff})
	f.Add("headers", "1", "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", []byte(nil))
	f.Add("\xff\xfe", "\x00", "a b", "\uffff", "\x01", []byte("x"))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, aggregateID string, payload []byte) {
		e := &event.Event{ID: "00000000-0000-4000-8000-000000000001", AggregateType: "order", AggregateID: aggregateID,
			EventType: "created", Payload: payload, ContentType: event.ContentTypeJSON, Headers: map[string]string{k1: v1, k2: v2}}
		m := newMessage(e, true, testRows)
		sent := map[string][]string{}
		for name, v := range m.attrs {
			if !validAttributeName(name) {
				t.Fatalf("attribute name %q", name)
			}
			value := aws.ToString(v.StringValue)
			if aws.ToString(v.DataType) == binaryType {
				value = string(v.BinaryValue)
			} else if !validText([]byte(value)) {
				t.Fatalf("attribute %s: String value %q SQS cannot carry", name, value)
			}
			sent[name] = []string{value}
		}
		own := map[string]string{}
		for name, v := range map[string]string{attrMessageID: e.ID, attrEventType: e.EventType, attrAggregateType: e.AggregateType,
			attrAggregateID: e.AggregateID, attrContentType: e.ContentType} {
			if v != "" {
				own[name] = v
			}
		}
		if enc := sent[attrBodyEncoding]; enc != nil {
			own[attrBodyEncoding] = enc[0]
		}
		if err := sinktest.CheckSent(sent, own, sink.SQSRules); err != nil {
			t.Fatalf("row headers %q: %v", e.Headers, err)
		}
		if len(m.attrs) > maxAttributes {
			t.Fatalf("%d attributes: %q", len(m.attrs), sent)
		}
		var inJSON map[string]string
		if m.headerJSON {
			if dt := aws.ToString(m.attrs[attrHeaders].DataType); dt != stringType {
				t.Fatalf("headers attribute of type %s: %q", dt, sent[attrHeaders])
			}
			if err := json.Unmarshal([]byte(sent[attrHeaders][0]), &inJSON); err != nil {
				t.Fatalf("headers attribute %q: %v", sent[attrHeaders], err)
			}
		}
		for k, v := range e.Headers {
			if testRows.Reason(k) != "" {
				continue
			}
			if got, ok := inJSON[viaJSON(k)]; ok && (got == viaJSON(v) || k1 != k2 && viaJSON(k1) == viaJSON(k2)) {
				continue
			}
			if (k != attrHeaders || !m.headerJSON) && len(sent[k]) == 1 && sent[k][0] == v && v != "" {
				continue
			}
			t.Fatalf("row header %q: %q not sent (attributes %q)", k, v, sent)
		}
	})
}

// viaJSON returns s as encoding/json reads it back: invalid UTF-8 replaced.
func viaJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	json.Unmarshal(b, &out)
	return out
}

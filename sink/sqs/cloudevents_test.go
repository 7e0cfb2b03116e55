package sqs

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/envelope/envelopetest"
)

// TestCloudEvents publishes to a FIFO queue of the emulator with the
// cloudevents envelope and reads each body with the CloudEvents SDK's JSON
// event format: every attribute and the data are right, and the contract
// attributes, the group and the row headers stay. An event without
// event_type fails as permanent. Without the envelope the body is the
// payload.
func TestCloudEvents(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "orders.fifo", nil)
	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{Envelope: envelopetest.New()})
	events := envelopetest.Events()
	if err := s.Publish(context.Background(), events); err != nil {
		t.Fatal(err)
	}
	bad := testEvent(9, "order", "o-9")
	bad.EventType = ""
	if err := s.Publish(context.Background(), []*event.Event{bad}); fault.ClassOf(sink.Failed(err, 0)) != fault.Permanent {
		t.Errorf("event without event_type: %v, want a permanent error", err)
	}

	msgs := receiveAll(t, c, url)
	if len(msgs) != len(events) {
		t.Fatalf("received %d messages, want %d", len(msgs), len(events))
	}
	for _, m := range msgs {
		e := envelopetest.Of(events, attr(m, attrMessageID))
		if e == nil {
			t.Fatalf("message with message_id %q was not published", attr(m, attrMessageID))
		}
		got, err := envelopetest.FromStructured(decodedBody(t, m))
		if err != nil {
			t.Fatalf("%s: the body is no valid CloudEvent: %v (%q)", e.ID, err, aws.ToString(m.Body))
		}
		if err := envelopetest.Match(got, e, envelopetest.Source+"/order"); err != nil {
			t.Errorf("%s: %v", e.ID, err)
		}
		if attr(m, attrContentType) != envelope.StructuredContentType || attr(m, attrEventType) != e.EventType ||
			attr(m, attrAggregateID) != e.AggregateID || m.Attributes["MessageGroupId"] != fifoID(e.AggregateID) {
			t.Errorf("%s: attributes %v, system attributes %v", e.ID, m.MessageAttributes, m.Attributes)
		}
		if e.Headers != nil && rowHeaders(t, m)["trace_id"] != "t-1" {
			t.Errorf("%s: row headers %v, want trace_id forwarded", e.ID, rowHeaders(t, m))
		}
	}

	plainURL := createQueue(t, c, "plain", nil)
	plain := newTestSink(t, srv.Endpoint(), Config{QueueURL: plainURL}, Options{})
	e := testEvent(10, "order", "o-10")
	if err := plain.Publish(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	for _, m := range receiveAll(t, c, plainURL) {
		if aws.ToString(m.Body) != string(e.Payload) || attr(m, attrContentType) != e.ContentType {
			t.Errorf("without the envelope: body %q, content_type %q", aws.ToString(m.Body), attr(m, attrContentType))
		}
	}
}

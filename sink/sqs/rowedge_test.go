package sqs

import (
	"context"
	"maps"
	"testing"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
)

// TestReservedAndControlAttributes: row headers named like an attribute
// the relay sets (in any case) or with a name SQS reserves (AWS., Amazon.)
// are dropped and counted, with few headers (one attribute each) and with
// many (the "headers" attribute); the rest arrive.
func TestReservedAndControlAttributes(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "rows", nil)
	drops := sink.NewHeaderDrops(nil)
	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{HeaderDrops: drops})
	few := testEvent(1, "order", "1")
	few.Headers = map[string]string{"MESSAGE_ID": "evil", "aws.trace": "evil", "x": "y"}
	many := testEvent(2, "order", "2")
	many.Headers = map[string]string{"Nats-Msg-Id": "evil", "user-agent": "evil", "Event_Type": "evil", "AMAZON.X": "evil",
		"AWS.SimpleQueueService.X": "evil", "a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"}
	if err := s.Publish(context.Background(), []*event.Event{few, many}); err != nil {
		t.Fatal(err)
	}
	msgs := receiveAll(t, c, url)
	if len(msgs) != 2 {
		t.Fatalf("received %d messages, want 2", len(msgs))
	}
	want := map[string]map[string]string{few.ID: {"x": "y"}, many.ID: {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"}}
	for _, m := range msgs {
		id := attr(m, "message_id")
		if got := rowHeaders(t, m); !maps.Equal(got, want[id]) {
			t.Errorf("event %s: row headers %v, want %v", id, got, want[id])
		}
	}
	if r, c := drops.Count(sink.DropReserved), drops.Count(sink.DropControl); r != 4 || c != 3 {
		t.Errorf("dropped %d reserved and %d control headers, want 4 and 3", r, c)
	}
}

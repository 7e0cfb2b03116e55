package kafka

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// TestLongTopicCut: a row whose aggregate_type would render a topic over
// Kafka's 249 characters goes to the topic cut to 249 characters and ended
// by the value's hash, which no other aggregate type shares.
func TestLongTopicCut(t *testing.T) {
	long := strings.Repeat("a", 300)
	topic := "outbox." + strings.Repeat("a", destname.MaxKafkaTopic-len("outbox.")-template.HashLen) + template.Hash(long)
	c := newCluster(t, kfake.SeedTopics(4, "outbox.order", topic))
	s := newSink(t, c.ListenAddrs(), "outbox.{aggregate_type}", Options{})
	batch := testEvents(3, 3)
	batch[1].AggregateType = long
	err := s.Publish(context.Background(), batch)
	if got, want := sinktest.Classes(err, 3), []string{"ok", "ok", "ok"}; !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	if got := s.DestinationOf(batch[1]); got != topic || len(got) != destname.MaxKafkaTopic {
		t.Errorf("DestinationOf = %.40q… (%d characters), want %.40q…", got, len(got), topic)
	}
}

// TestReservedHeaderCaseVariants: row headers named like a header the
// relay sets on any sink, in any case, are dropped and counted; Kafka
// interprets no header, so Nats-Rollup is forwarded.
func TestReservedHeaderCaseVariants(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "outbox.order"))
	drops := sink.NewHeaderDrops(nil)
	s := newSink(t, c.ListenAddrs(), "outbox.{aggregate_type}", Options{HeaderDrops: drops})
	e := testEvent(1, "order", "1")
	e.Headers = map[string]string{"nats-msg-id": "evil", "MESSAGE_ID": "evil", "Content-Type": "evil", "Idempotency-Key": "evil",
		"user-agent": "evil", "Webhook-Signature": "evil", "Nats-Rollup": "sub", "x": "y"}
	if err := s.Publish(context.Background(), []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	recs := readTopics(t, c.ListenAddrs(), "outbox.order")
	if len(recs) != 1 {
		t.Fatalf("read %d records, want 1", len(recs))
	}
	var got []string
	for _, h := range recs[0].Headers {
		if string(h.Value) == "evil" {
			t.Errorf("the row header %s: %s was sent", h.Key, h.Value)
		}
		got = append(got, h.Key)
	}
	if want := []string{"Nats-Rollup", "x", "message_id", "event_type", "aggregate_type", "aggregate_id", "content-type"}; !slices.Equal(got, want) {
		t.Errorf("headers %q, want %q", got, want)
	}
	if n := drops.Count(sink.DropReserved); n != 6 {
		t.Errorf("%d reserved headers counted as dropped, want 6", n)
	}
}

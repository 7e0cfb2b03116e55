package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// suiteMaxMessageBytes is the max.message.bytes of the topics in the
// conformance suite: kfake's default, which its DescribeConfigs reports
// even when the broker's message.max.bytes is lowered, unlike Kafka.
const suiteMaxMessageBytes = 1048588

// received returns every record of the topics starting with prefix.
func received(t *testing.T, brokers []string, prefix string) []sinktest.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := kafkatest.Read(ctx, brokers, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []sinktest.Message
	for _, r := range recs {
		h := map[string][]string{}
		for _, rh := range r.Headers {
			h[rh.Key] = append(h[rh.Key], string(rh.Value))
		}
		msgs = append(msgs, sinktest.Message{Destination: r.Topic, Key: string(r.Key), Headers: h, Payload: r.Value, Raw: r.Raw})
	}
	return msgs
}

// TestConformance runs the shared sink suite against an in-process kfake
// broker that is restarted and stopped with its data kept on disk.
func TestConformance(t *testing.T) {
	r, err := kafkatest.Start(kafkatest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	stalled := newCluster(t)
	stall(stalled)

	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T, _, tmpl string) sink.Sink {
			return newSinkConfig(t, Config{Brokers: r.Addrs(), Topic: tmpl, Partitions: 3}, Options{AckTimeout: 5 * time.Second})
		},
		Received: func(t *testing.T, scope string) []sinktest.Message {
			return received(t, r.Addrs(), scope+".")
		},
		Sanitize: sanitize,
		Restart: func(t *testing.T) {
			r.Stop()
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
		},
		Stop: func(*testing.T) { r.Stop() },
		Start: func(t *testing.T) {
			if err := r.Start(); err != nil {
				t.Fatal(err)
			}
		},
		NewStalled: func(t *testing.T, _, tmpl string) sink.Sink {
			return newSinkConfig(t, Config{Brokers: stalled.ListenAddrs(), Topic: tmpl}, Options{AckTimeout: time.Minute})
		},
		MaxMessageBytes: suiteMaxMessageBytes,
		Features: sinktest.Features{
			KeyedByAggregate:  true,
			ContentTypeHeader: "content-type",
		},
	})
}

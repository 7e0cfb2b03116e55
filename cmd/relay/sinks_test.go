package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// TestEverySink runs relay run end to end against Kafka, RabbitMQ, SQS (FIFO),
// Pub/Sub (pstest), Redis Streams and a webhook receiver, with a kill -9 in the middle: no loss, message_id on
// every copy, per-aggregate order of first deliveries, outbox archived.
// NATS has the other end-to-end tests.
func TestEverySink(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (sinkYAML string, collect func() []verify.Delivery)
	}{
		{"kafka", startKafka},
		{"rabbitmq", startRabbitMQ},
		{"sqs", startSQS},
		{"pubsub", startPubSub},
		{"redis", startRedisSink},
		{"webhook", startWebhook},
	} {
		for _, mode := range []string{"poll", "wal"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				testSink(t, mode, tc.start)
			})
		}
	}
}

// testSink runs one sink in one capture mode.
func testSink(t *testing.T, mode string, start func(t *testing.T) (string, func() []verify.Delivery)) {
	sinkYAML, collect := start(t)
	s := newStack(t, stackOptions{Mode: mode, Sink: sinkYAML, Collect: collect})
	ctx := context.Background()
	s.produce(ctx, 1500, 150, 4)
	relay := s.start()
	s.waitPublishing()
	relay.kill()
	s.produce(ctx, 1500, 150, 4)
	relay = s.start()
	s.waitDrained(3 * time.Minute) // the SQS emulator and its consumer are slow on a loaded machine
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	t.Logf("%s: %s", mode, wire)
}

// payloadDelivery builds a delivery from a message's id, aggregate_id and
// payload, checking the payload's aggregate against the header.
func payloadDelivery(id, aggregate string, payload []byte) verify.Delivery {
	var body struct {
		Aggregate string
		Step      int
	}
	d := verify.Delivery{MessageID: id, AggregateID: aggregate}
	if err := json.Unmarshal(payload, &body); err != nil {
		d.Problem = "payload: " + err.Error()
	}
	d.Step = body.Step
	if body.Aggregate != aggregate {
		d.Problem = fmt.Sprintf("aggregate_id %q differs from the payload's %q", aggregate, body.Aggregate)
	}
	return d
}

func startKafka(t *testing.T) (string, func() []verify.Delivery) {
	_, yaml, collect := startKafkaCluster(t)
	return yaml, collect
}

// startKafkaCluster starts a Kafka cluster and returns it, the config's
// sink block and a collector of its records.
func startKafkaCluster(t *testing.T) (*kafkatest.Cluster, string, func() []verify.Delivery) {
	c, err := kafkatest.Start(kafkatest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	collect := func() []verify.Delivery {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		recs, err := c.Records(ctx, "outbox.")
		if err != nil {
			return nil
		}
		var ds []verify.Delivery
		for _, r := range recs {
			id, _ := r.Header("message_id")
			agg, _ := r.Header("aggregate_id")
			d := payloadDelivery(id, agg, r.Value)
			if string(r.Key) != agg {
				d.Problem = "record key " + string(r.Key) + " is not the aggregate_id"
			}
			ds = append(ds, d)
		}
		return ds
	}
	return c, fmt.Sprintf("sink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n    partitions: 4\n", c.Addrs()[0]), collect
}

func startSQS(t *testing.T) (string, func() []verify.Delivery) {
	srv, _, collect := startSQSQueue(t)
	return sqsSink(srv.Endpoint()), collect
}

// sqsSink is the config's sink block for SQS at endpoint.
func sqsSink(endpoint string) string {
	return fmt.Sprintf("sink:\n  type: sqs\n  sqs:\n    region: us-east-1\n    endpoint: %s\n    queue: outbox-{aggregate_type}.fifo\n", endpoint)
}

// sqsQueue is the name of the FIFO queue startSQSQueue creates.
const sqsQueue = "outbox-order.fifo"

// startSQSQueue starts the SQS emulator with the FIFO queue sqsQueue and
// returns it, the queue's URL and a collector that receives (and deletes)
// the queue's messages, adding them to those it received before. A failed
// receive is logged; the messages it left are received by a later call.
func startSQSQueue(t *testing.T) (*testenv.SQS, string, func() []verify.Delivery) {
	srv, err := testenv.StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	url, err := srv.CreateQueue(sqsQueue, map[string]string{"FifoQueue": "true"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ds []verify.Delivery
	collect := func() []verify.Delivery {
		mu.Lock()
		defer mu.Unlock()
		msgs, err := srv.ReceiveAll(url)
		if err != nil {
			t.Logf("receive from the SQS emulator, after %d messages: %v", len(msgs), err)
		}
		for _, m := range msgs {
			payload, err := m.Payload()
			d := payloadDelivery(m.Attr("message_id"), m.Attr("aggregate_id"), payload)
			switch {
			case err != nil:
				d.Problem = err.Error()
			case m.Attributes["MessageGroupId"] != d.AggregateID:
				d.Problem = "MessageGroupId " + m.Attributes["MessageGroupId"] + " is not the aggregate_id"
			case m.Attributes["MessageDeduplicationId"] != d.MessageID:
				d.Problem = "MessageDeduplicationId " + m.Attributes["MessageDeduplicationId"] + " is not the message_id"
			}
			ds = append(ds, d)
		}
		return append([]verify.Delivery(nil), ds...)
	}
	return srv, url, collect
}

// startWebhook starts a receiver that fails the first attempt of about one
// event in twenty with a 500, so retries carry the same Idempotency-Key.
func startWebhook(t *testing.T) (string, func() []verify.Delivery) {
	var mu sync.Mutex
	var ds []verify.Delivery
	failed := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("Idempotency-Key")
		h := fnv.New32a()
		h.Write([]byte(id))
		mu.Lock()
		defer mu.Unlock()
		if h.Sum32()%20 == 0 && !failed[id] {
			failed[id] = true
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		d := payloadDelivery(r.Header.Get("message_id"), r.Header.Get("aggregate_id"), body)
		if id != d.MessageID {
			d.Problem = "Idempotency-Key " + id + " differs from message_id"
		}
		ds = append(ds, d)
	}))
	t.Cleanup(srv.Close)
	collect := func() []verify.Delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]verify.Delivery(nil), ds...)
	}
	return fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events/{aggregate_type}\n", srv.URL), collect
}

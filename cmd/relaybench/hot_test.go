package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
	kafkasink "github.com/outboxrelay/relay/sink/kafka"
	natssink "github.com/outboxrelay/relay/sink/nats"
	redissink "github.com/outboxrelay/relay/sink/redis"
	"github.com/outboxrelay/relay/sink/sinktest"
	sqssink "github.com/outboxrelay/relay/sink/sqs"
	"github.com/outboxrelay/relay/sink/webhook"
)

// hotEvents is how many events of one aggregate each iteration of
// BenchmarkHotAggregate publishes.
const hotEvents = 5000

// BenchmarkHotAggregate publishes events of a single aggregate through the
// pipeline into each sink's broker (kfake, embedded NATS JetStream, the SQS
// emulator with a FIFO queue, a redis-server, an httptest receiver) and reports events/s:
// what one hot aggregate gets from each sink, without the database.
//
//	go test ./cmd/relaybench -run '^$' -bench HotAggregate -benchtime 3x
func BenchmarkHotAggregate(b *testing.B) {
	for _, name := range []string{"kafka", "nats", "redis", "sqs", "webhook"} {
		b.Run(name, func(b *testing.B) {
			snk := hotSink(b, name)
			opts := pipeline.Options{Logger: slog.New(slog.DiscardHandler)}
			var total time.Duration
			for i := range b.N {
				evs := make([]*event.Event, hotEvents)
				for j := range evs {
					evs[j] = &event.Event{ID: fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", i, j), AggregateType: "order",
						AggregateID: fmt.Sprint("hot-", i), EventType: "step", Payload: []byte(`{"step":1}`),
						ContentType: event.ContentTypeJSON, Position: uint64(j + 1)}
				}
				dead, took := sinktest.Drive(b, snk, evs, opts)
				if len(dead) > 0 {
					b.Fatalf("%d dead letters, first: %s", len(dead), dead[0].Err)
				}
				total += took
			}
			b.ReportMetric(float64(b.N*hotEvents)/total.Seconds(), "events/s")
		})
	}
}

// hotSink starts the broker of sink name and returns a sink publishing to
// it; both end with the benchmark.
func hotSink(b *testing.B, name string) sink.Sink {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	var snk sink.Sink
	var err error
	switch name {
	case "kafka":
		c, cerr := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "outbox.order"))
		if cerr != nil {
			b.Fatal(cerr)
		}
		b.Cleanup(c.Close)
		snk, err = kafkasink.New(ctx, kafkasink.Config{Brokers: c.ListenAddrs(), Topic: "outbox.{aggregate_type}"}, kafkasink.Options{Logger: quiet})
	case "nats":
		n, nerr := testenv.StartNATS(testenv.NATSOptions{})
		if nerr != nil {
			b.Fatal(nerr)
		}
		b.Cleanup(n.Shutdown)
		var s *natssink.Sink
		if s, err = natssink.New(ctx, natssink.Config{URL: n.URL(), Subject: "outbox.{aggregate_type}", Stream: "OUTBOX"}, natssink.Options{Logger: quiet}); err == nil {
			snk, err = s, s.EnsureStream(ctx)
		}
	case "sqs":
		srv, serr := testenv.StartSQS()
		if serr != nil {
			b.Fatal(serr)
		}
		b.Cleanup(srv.Shutdown)
		url, qerr := srv.CreateQueue("outbox-order.fifo", map[string]string{"FifoQueue": "true"})
		if qerr != nil {
			b.Fatal(qerr)
		}
		b.Setenv("AWS_ACCESS_KEY_ID", "test")
		b.Setenv("AWS_SECRET_ACCESS_KEY", "test")
		snk, err = sqssink.New(ctx, sqssink.Config{Region: "us-east-1", Endpoint: srv.Endpoint(), QueueURL: url}, sqssink.Options{Logger: quiet})
	case "redis":
		srv := testenv.StartRedis(b, testenv.RedisOptions{})
		snk, err = redissink.New(redissink.Config{URL: srv.URL(), Stream: "outbox.{aggregate_type}"}, redissink.Options{Logger: quiet})
	case "webhook":
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		b.Cleanup(srv.Close)
		snk, err = webhook.New(webhook.Config{URL: srv.URL + "/{aggregate_type}"}, webhook.Options{Logger: quiet})
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { snk.Close() })
	return snk
}

package nats

import (
	"bytes"
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/testenv"
)

// BenchmarkPublish publishes events of 200-byte payloads with two row
// headers in batches of 500 to an embedded JetStream server: one op is one
// event, published and acknowledged. The server runs in the benchmark's
// process, so allocs/op include its own.
func BenchmarkPublish(b *testing.B) {
	srv := startServer(b, testenv.NATSOptions{})
	s := newStreamSink(b, srv.URL(), Options{})
	batch := testEvents(500, 500)
	for _, e := range batch {
		e.Payload = bytes.Repeat([]byte("x"), 200)
		e.Headers = map[string]string{"source": "bench", "tenant": "t1"}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(batch) {
		if err := s.Publish(ctx, batch[:min(len(batch), b.N-i)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishLibrary is BenchmarkPublish's baseline: the same events
// published as the library's own documentation does, a nats.Msg with the
// contract's headers per event through jetstream.PublishMsgAsync, waiting
// for every PubAck future of the batch.
func BenchmarkPublishLibrary(b *testing.B) {
	srv := startServer(b, testenv.NATSOptions{})
	newStreamSink(b, srv.URL(), Options{}) // creates the stream
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	batch := testEvents(500, 500)
	payload := bytes.Repeat([]byte("x"), 200)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(batch) {
		futures := make([]jetstream.PubAckFuture, 0, len(batch))
		for _, e := range batch[:min(len(batch), b.N-i)] {
			m := nats.NewMsg("outbox." + e.AggregateType)
			m.Data = payload
			m.Header.Set("Nats-Msg-Id", e.ID)
			m.Header.Set("message_id", e.ID)
			m.Header.Set("event_type", e.EventType)
			m.Header.Set("aggregate_type", e.AggregateType)
			m.Header.Set("aggregate_id", e.AggregateID)
			m.Header.Set("source", "bench")
			m.Header.Set("tenant", "t1")
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				b.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			}
		}
	}
}

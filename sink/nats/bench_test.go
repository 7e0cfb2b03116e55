package nats

import (
	"bytes"
	"context"
	"testing"

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

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// TestBigTransactionMemory commits five large rows in one transaction and
// checks that `relay run` publishes them (or dead-letters them, when NATS's
// max_payload is below their size) while its peak resident memory stays
// under the bound of docs/operations.md, memoryBound, in both capture
// modes. The rows are 20 MiB each; RELAY_BIG=1 makes them 50 MiB.
func TestBigTransactionMemory(t *testing.T) {
	t.Parallel()
	size := 20 << 20
	if os.Getenv("RELAY_BIG") != "" {
		size = 50 << 20
	}
	const rows = 5
	bound := memoryBound(8<<20, int64(size))
	for _, sk := range []struct {
		name string
		dead bool // the rows are over the sink's size limit
		nats testenv.NATSOptions
	}{
		{name: "nats", nats: testenv.NATSOptions{MaxPayload: 64 << 20}},
		{name: "nats-over-max-payload", dead: true},
		{name: "webhook"},
	} {
		for _, mode := range []string{"poll", "wal"} {
			t.Run(sk.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				o := stackOptions{Mode: mode, NATS: sk.nats, Collect: func() []verify.Delivery { return nil }}
				var hook *bodyCounter
				if sk.name == "webhook" {
					hook = &bodyCounter{}
					srv := httptest.NewServer(hook)
					t.Cleanup(srv.Close)
					o.Sink = fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/{aggregate_type}\n    timeout: 60s\n", srv.URL)
				}
				s := newStack(t, o)
				relay := s.start()
				waitFor(t, func() bool { return s.outboxRows() == 0 && testenv.PeakRSS(t, relay.cmd.Process.Pid) > 0 })
				ctx := context.Background()
				if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
					SELECT gen_random_uuid(), 'big', 'agg-' || (i % 2), 'step', jsonb_build_object('i', i, 'pad', repeat('x', $1))
					FROM generate_series(1, $2) AS i`, size, rows); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(3 * time.Minute)
				for s.outboxRows() > 0 {
					if time.Now().After(deadline) {
						t.Fatalf("%d rows left in the outbox after 3 minutes", s.outboxRows())
					}
					time.Sleep(100 * time.Millisecond)
				}
				peak := testenv.PeakRSS(t, relay.cmd.Process.Pid)
				if code := relay.stop(t, 30*time.Second); code != 0 {
					t.Fatalf("relay exited %d", code)
				}
				switch {
				case sk.dead, sk.name == "nats" && size > 32<<20: // a file stream stores no message over 32 MiB
					if n := s.deadLetters(); n != rows {
						t.Fatalf("%d dead letters, want %d", n, rows)
					}
				case hook != nil:
					if n, b := hook.counts(); n != rows || b < rows*size {
						t.Fatalf("webhook received %d requests of %d bytes, want %d of at least %d", n, b, rows, rows*size)
					}
				default:
					if n := len(streamDeliveries(t, s.nats.URL())); n != rows {
						t.Fatalf("stream holds %d messages, want %d", n, rows)
					}
				}
				t.Logf("%d rows of %d MiB in one transaction: peak RSS %d MiB, bound %d MiB", rows, size>>20, peak>>20, bound>>20)
				if peak > bound {
					t.Errorf("peak RSS %d MiB, over the bound of %d MiB", peak>>20, bound>>20)
				}
			})
		}
	}
}

// memoryBound is the peak resident memory docs/operations.md states for
// a relay with capture.max_batch_bytes batch whose largest row holds row
// bytes: 64 MiB (the runtime's soft memory limit) and six times the larger
// of the two: three batches captured and not archived (a row larger than a
// batch is a batch of its own), one more being read, the database driver's
// buffer and the sink's copy.
func memoryBound(batch, row int64) int64 {
	return 64<<20 + 6*max(row, batch)
}

// bodyCounter is a webhook receiver that counts requests and body bytes.
type bodyCounter struct {
	mu    sync.Mutex
	n     int
	bytes int
}

func (c *bodyCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	c.bytes += int(n)
}

func (c *bodyCounter) counts() (requests, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.bytes
}

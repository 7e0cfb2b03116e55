package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
)

// benchSource hands out batches of 500 events over 10,000 aggregates, from
// a ring of prebuilt batches larger than the pipeline's window, until n
// events were handed out; done is closed once all of them were archived.
type benchSource struct {
	ring     [][]*event.Event
	next     int
	left     int
	archived atomic.Int64
	n        int64
	done     chan struct{}
}

func newBenchSource(n int) *benchSource {
	s := &benchSource{left: n, n: int64(n), done: make(chan struct{})}
	k := 0
	for range 64 {
		evs := make([]*event.Event, 500)
		for i := range evs {
			evs[i] = &event.Event{ID: fmt.Sprintf("id-%d", k), AggregateType: "order",
				AggregateID: fmt.Sprintf("agg-%d", k%10000), EventType: "created",
				Payload: make([]byte, 200), CreatedAt: time.Now()}
			k++
		}
		s.ring = append(s.ring, evs)
	}
	return s
}

func (s *benchSource) Next(ctx context.Context) (capture.Batch, error) {
	if s.left == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	evs := s.ring[s.next%len(s.ring)][:min(500, s.left)]
	s.next++
	s.left -= len(evs)
	return &benchBatch{s: s, evs: evs}, nil
}

func (s *benchSource) Close() error { return nil }

type benchBatch struct {
	s   *benchSource
	evs []*event.Event
}

func (b *benchBatch) Events() []*event.Event { return b.evs }

func (b *benchBatch) Complete(ctx context.Context, o capture.Outcome) error {
	if b.s.archived.Add(int64(len(o.Published))) == b.s.n {
		close(b.s.done)
	}
	return nil
}

func (b *benchBatch) Abandon(ctx context.Context) {}

// benchSink acknowledges everything at once and names one destination per
// aggregate type, as the NATS sink's subject does.
type benchSink struct{}

func (benchSink) Publish(ctx context.Context, batch []*event.Event) error { return nil }
func (benchSink) Close() error                                            { return nil }
func (benchSink) DestinationOf(e *event.Event) string                     { return e.AggregateType }
func (benchSink) Probe(ctx context.Context, dest string) error            { return nil }

// BenchmarkEngine runs the pipeline over b.N events from a source and to a
// sink that cost nothing, with metrics: one op is one event captured,
// published and archived.
func BenchmarkEngine(b *testing.B) {
	src := newBenchSource(b.N)
	opts := Options{Logger: discardLogger(), Metrics: NewMetrics(prometheus.NewRegistry(), "bench")}
	p := New(src, benchSink{}, opts)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { errc <- p.Run(ctx) }()
	<-src.done
	b.StopTimer()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// TestEngineAllocations: moving an event through the pipeline allocates
// less than once per event; the queues, the ready list and the outcome
// slices are reused or allocated per batch.
func TestEngineAllocations(t *testing.T) {
	if r := testing.Benchmark(BenchmarkEngine); r.AllocsPerOp() > 0 {
		t.Errorf("%d allocations per event, want less than one", r.AllocsPerOp())
	}
}

// TestReadyList: the ready list hands out aggregates first in, first out
// while they are added and taken in turns, and its array stays within
// a few times the most aggregates ready at once.
func TestReadyList(t *testing.T) {
	e := &engine{}
	var in, out []string
	most := 0
	push := func() {
		q := &aggQueue{id: fmt.Sprint(len(in)), heapIdx: -1, items: []*item{{}}}
		in = append(in, q.id)
		e.markReady(q)
	}
	for round := range 1000 {
		for range round%7 + 1 {
			push()
		}
		for range round%5 + 1 {
			if len(e.ready) > 0 {
				out = append(out, e.popReady().id)
			}
		}
		most = max(most, len(e.ready)-e.readyAt)
		if cap(e.ready) > 4*most+16 {
			t.Fatalf("round %d: at most %d ready, in an array of %d", round, most, cap(e.ready))
		}
	}
	for len(e.ready) > 0 {
		out = append(out, e.popReady().id)
	}
	if !slices.Equal(in, out) {
		t.Fatalf("taken in another order than added")
	}
}

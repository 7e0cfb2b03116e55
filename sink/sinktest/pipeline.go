package sinktest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
)

// captureBatch is how many events Drive hands the pipeline at a time, poll
// capture's default batch size.
const captureBatch = 500

// Drive publishes events through a pipeline into snk, handing them over in
// batches of 500 as poll capture does, until every event is published or
// dead-lettered, and returns the dead letters and how long it took. It
// fails t when that takes more than a minute.
func Drive(t testing.TB, snk sink.Sink, events []*event.Event, opts pipeline.Options) ([]capture.DeadEvent, time.Duration) {
	t.Helper()
	src := &captured{settled: make(chan struct{}, 1)}
	for i := 0; i < len(events); i += captureBatch {
		src.batches = append(src.batches, events[i:min(i+captureBatch, len(events))])
	}
	p := pipeline.New(src, snk, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	deadline := time.After(time.Minute)
	for src.count() < len(events) {
		select {
		case <-src.settled:
		case <-deadline:
			t.Fatalf("%d of %d events published or dead after a minute", src.count(), len(events))
		}
	}
	took := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return src.dead, took
}

// captured is a capture.Source handing out prepared batches.
type captured struct {
	mu      sync.Mutex
	batches [][]*event.Event
	n       int // events settled
	dead    []capture.DeadEvent
	settled chan struct{}
}

func (s *captured) Next(ctx context.Context) (capture.Batch, error) {
	s.mu.Lock()
	if len(s.batches) > 0 {
		b := &capturedBatch{src: s, evs: s.batches[0]}
		s.batches = s.batches[1:]
		s.mu.Unlock()
		return b, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *captured) Close() error { return nil }

func (s *captured) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

type capturedBatch struct {
	src *captured
	evs []*event.Event
}

func (b *capturedBatch) Events() []*event.Event  { return b.evs }
func (b *capturedBatch) Abandon(context.Context) {}

func (b *capturedBatch) Complete(_ context.Context, o capture.Outcome) error {
	b.src.mu.Lock()
	b.src.n += len(o.Published) + len(o.Dead)
	b.src.dead = append(b.src.dead, o.Dead...)
	b.src.mu.Unlock()
	select {
	case b.src.settled <- struct{}{}:
	default:
	}
	return nil
}

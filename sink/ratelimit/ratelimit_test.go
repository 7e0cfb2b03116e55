package ratelimit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// recorder is an inner sink that records the size and time of each publish.
type recorder struct {
	mu    sync.Mutex
	sizes []int
	at    []time.Time
}

func (r *recorder) Publish(_ context.Context, batch []*event.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes = append(r.sizes, len(batch))
	r.at = append(r.at, time.Now())
	return nil
}
func (r *recorder) Close() error                               { return nil }
func (r *recorder) DestinationOf(e *event.Event) string        { return "dest-" + e.AggregateType }
func (r *recorder) Probe(_ context.Context, dest string) error { return sink.ErrNoProbe }
func (r *recorder) published() (n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sizes {
		n += s
	}
	return n
}

func batchOf(n int) []*event.Event {
	b := make([]*event.Event, n)
	for i := range b {
		b[i] = &event.Event{ID: "id", AggregateType: "order"}
	}
	return b
}

// TestPublishCapsRate publishes 60 events in batches of 10 from 4
// goroutines at 100/s with a burst of 10: after the first burst the other
// 50 need at least 0.5s.
func TestPublishCapsRate(t *testing.T) {
	rec := &recorder{}
	s := New(rec, 100, 10)
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2 {
				if err := s.Publish(context.Background(), batchOf(10)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := s.Publish(context.Background(), batchOf(10)); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if rec.published() != 90 {
		t.Fatalf("published %d events, want 90", rec.published())
	}
	// 90 events, 10 of them from the initial burst: at least 0.8s.
	if elapsed < 750*time.Millisecond {
		t.Errorf("90 events at 100/s with burst 10 took %s, want at least 0.8s", elapsed)
	}
	if s.Waited() < 750*time.Millisecond {
		t.Errorf("Waited() = %s, want at least the time the last call waited", s.Waited())
	}
	t.Logf("90 events in %s, waited %s in total", elapsed, s.Waited())
}

// TestPublishLargerThanBurst checks that a batch larger than the burst waits
// for it in steps, then goes out whole.
func TestPublishLargerThanBurst(t *testing.T) {
	rec := &recorder{}
	s := New(rec, 100, 5)
	start := time.Now()
	if err := s.Publish(context.Background(), batchOf(25)); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < 180*time.Millisecond {
		t.Errorf("25 events at 100/s with burst 5 took %s, want at least 0.2s", elapsed)
	}
	if len(rec.sizes) != 1 || rec.sizes[0] != 25 {
		t.Errorf("inner publishes %v, want one of 25", rec.sizes)
	}
}

// TestPublishCancelledWhileWaiting checks that a wait ends with ctx, is
// classified unavailable (not the event's fault) and publishes nothing.
func TestPublishCancelledWhileWaiting(t *testing.T) {
	rec := &recorder{}
	s := New(rec, 1, 1)
	if err := s.Publish(context.Background(), batchOf(1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Publish(ctx, batchOf(1)) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Waiting() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the second publish never waited")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || fault.ClassOf(err) != fault.Unavailable {
			t.Errorf("got %v (class %v), want context.Canceled classified unavailable", err, fault.ClassOf(err))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return after its context was cancelled")
	}
	if rec.published() != 1 {
		t.Errorf("published %d events, want only the first", rec.published())
	}
	if s.Waiting() != 0 {
		t.Errorf("Waiting() = %d after the wait ended", s.Waiting())
	}
}

func TestDefaultBurst(t *testing.T) {
	for rate, want := range map[int]int{1: 1, 9: 1, 10: 1, 11: 2, 200: 20, 5000: 500} {
		if got := DefaultBurst(rate); got != want {
			t.Errorf("DefaultBurst(%d) = %d, want %d", rate, got, want)
		}
	}
	if got := New(&recorder{}, 200, 0).Burst(); got != 20 {
		t.Errorf("New(200, 0).Burst() = %d, want 20", got)
	}
}

// TestForwardsDestinations checks that the pipeline still sees the inner
// sink's destinations and probes through the limiter.
func TestForwardsDestinations(t *testing.T) {
	var s sink.Sink = New(&recorder{}, 1, 1)
	d, ok := s.(sink.Destinations)
	if !ok {
		t.Fatal("the limited sink does not implement sink.Destinations")
	}
	if got := d.DestinationOf(&event.Event{AggregateType: "order"}); got != "dest-order" {
		t.Errorf("DestinationOf = %q", got)
	}
	if err := d.Probe(context.Background(), "x"); !errors.Is(err, sink.ErrNoProbe) {
		t.Errorf("Probe = %v", err)
	}
}

// ordered is a recorder that declares sink.Ordered.
type ordered struct{ recorder }

func (*ordered) MaxPerAggregate() int { return 500 }

// TestForwardsOrdered checks that the limited sink declares the inner
// sink's sink.Ordered, and 1 for an inner sink without it.
func TestForwardsOrdered(t *testing.T) {
	var s sink.Sink = New(&ordered{}, 1, 1)
	if o, ok := s.(sink.Ordered); !ok || o.MaxPerAggregate() != 500 {
		t.Errorf("limited sink.Ordered sink: MaxPerAggregate not forwarded")
	}
	if n := New(&recorder{}, 1, 1).MaxPerAggregate(); n != 1 {
		t.Errorf("limited sink without sink.Ordered: MaxPerAggregate %d, want 1", n)
	}
}

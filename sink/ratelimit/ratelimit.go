// Package ratelimit caps how many events per second a sink publishes.
package ratelimit

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// Inner is the sink a Sink limits: every broker sink names its
// destinations and probes them.
type Inner interface {
	sink.Sink
	sink.Destinations
}

// Sink publishes through an inner sink at most a given number of events per
// second, across all its concurrent Publish calls, letting through up to a
// burst at once after an idle spell. DestinationOf, Probe and Close are the
// inner sink's; probes are not limited. Its methods are safe for concurrent
// use.
type Sink struct {
	Inner
	lim     *rate.Limiter
	waited  atomic.Int64 // nanoseconds Publish calls spent waiting, summed
	waiting atomic.Int64 // events of the Publish calls waiting now
}

// New limits inner to eventsPerSecond (more than 0) with the given burst.
// A burst of 0 or less means a tenth of eventsPerSecond, at least 1.
func New(inner Inner, eventsPerSecond, burst int) *Sink {
	if burst <= 0 {
		burst = DefaultBurst(eventsPerSecond)
	}
	return &Sink{Inner: inner, lim: rate.NewLimiter(rate.Limit(eventsPerSecond), burst)}
}

// DefaultBurst is the burst New uses for a rate without one: a tenth of a
// second's worth, at least 1.
func DefaultBurst(eventsPerSecond int) int { return max(1, (eventsPerSecond+9)/10) }

// Burst returns the most events one Publish call can send without waiting
// for more than one refill; callers keep batches at most this large so the
// receiver never sees more than a burst at once.
func (s *Sink) Burst() int { return s.lim.Burst() }

// Publish waits until the limit lets len(batch) events through, then
// publishes them with the inner sink. A batch larger than the burst waits
// for it in steps of one burst and is then published at once. While it
// waits nothing is sent, so the wait is no publish attempt. When ctx ends
// during the wait Publish returns ctx's error, classified
// fault.Unavailable, without publishing.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	if err := s.wait(ctx, len(batch)); err != nil {
		return fault.AsUnavailable(fmt.Errorf("rate limit: %w", err))
	}
	return s.Inner.Publish(ctx, batch)
}

func (s *Sink) wait(ctx context.Context, n int) error {
	s.waiting.Add(int64(n))
	start := time.Now()
	defer func() {
		s.waiting.Add(-int64(n))
		s.waited.Add(int64(time.Since(start)))
	}()
	for left := n; left > 0; {
		step := min(left, s.lim.Burst())
		if err := s.lim.WaitN(ctx, step); err != nil {
			return err
		}
		left -= step
	}
	return nil
}

// RowChosen implements sink.RowRouted with the inner sink's answer.
func (s *Sink) RowChosen() bool { return sink.RowChosen(s.Inner) }

// MaxPerAggregate implements sink.Ordered with the inner sink's value, or
// 1 when the inner sink does not implement it: Publish hands each batch to
// the inner sink whole and in order.
func (s *Sink) MaxPerAggregate() int {
	if o, ok := s.Inner.(sink.Ordered); ok {
		return o.MaxPerAggregate()
	}
	return 1
}

// Waited returns the time Publish calls spent waiting for the limit,
// summed over concurrent calls.
func (s *Sink) Waited() time.Duration { return time.Duration(s.waited.Load()) }

// Waiting returns how many events wait for the limit now.
func (s *Sink) Waiting() int64 { return s.waiting.Load() }

package sinktest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// driver publishes events the way the pipeline does: each aggregate's
// events in order, only the head of an aggregate in flight and never two
// events of one aggregate in a batch, batches of ready heads from several
// concurrent Publish calls, and failed events retried after a backoff until
// they are acknowledged. A permanent failure stops it.
type driver struct {
	snk       sink.Sink
	workers   int           // concurrent Publish calls
	batchSize int           // most events in one call
	pace      time.Duration // least time between the starts of two calls; 0 for none

	acked    atomic.Int64 // events acknowledged so far
	failures atomic.Int64 // failed publish attempts of single events

	mu      sync.Mutex
	classes map[fault.Class]int // failed attempts by class
	lastErr error
}

func newDriver(snk sink.Sink, workers, batchSize int) *driver {
	return &driver{snk: snk, workers: workers, batchSize: batchSize, classes: map[fault.Class]int{}}
}

// source yields the events to publish; it returns nil when there are no
// more for now (the driver asks again after each result) and done when
// there will be none.
type source func() (e *event.Event, done bool)

// sliceSource yields the events of evs.
func sliceSource(evs []*event.Event) source {
	i := 0
	return func() (*event.Event, bool) {
		if i == len(evs) {
			return nil, true
		}
		i++
		return evs[i-1], false
	}
}

type driveResult struct {
	aggs  []string
	batch []*event.Event
	err   error
}

// run publishes every event of src until all are acknowledged. It returns
// an error when an event fails permanently or ctx ends first. At most
// window events are taken from src and not yet acknowledged at any time.
func (d *driver) run(ctx context.Context, src source, window int) error {
	window = max(window, 1) // a window of 0 would never read the source's end
	queues := map[string][]*event.Event{}
	var ready []string
	attempts := map[string]int{}
	results := make(chan driveResult, d.workers)
	retry := make(chan string, window+1)
	held, inFlight := 0, 0
	srcDone := false
	var lastStart time.Time

	for {
		for !srcDone && held < window {
			e, done := src()
			if done {
				srcDone = true
			}
			if e == nil {
				break
			}
			q, busy := queues[e.Key()]
			queues[e.Key()] = append(q, e)
			if !busy {
				ready = append(ready, e.Key())
			}
			held++
		}
		if srcDone && held == 0 && inFlight == 0 {
			return nil
		}
		var paced <-chan time.Time
		for inFlight < d.workers && len(ready) > 0 {
			if wait := d.pace - time.Since(lastStart); d.pace > 0 && wait > 0 {
				paced = time.After(wait)
				break
			}
			n := min(len(ready), d.batchSize)
			aggs := ready[:n:n]
			ready = ready[n:]
			batch := make([]*event.Event, n)
			for i, a := range aggs {
				batch[i] = queues[a][0]
			}
			inFlight++
			lastStart = time.Now()
			go func() {
				results <- driveResult{aggs: aggs, batch: batch, err: d.snk.Publish(ctx, batch)}
			}()
		}
		select {
		case r := <-results:
			inFlight--
			for i, a := range r.aggs {
				err := sink.Failed(r.err, i)
				if err == nil {
					attempts[a] = 0
					q := queues[a][1:]
					held--
					d.acked.Add(1)
					if len(q) == 0 {
						delete(queues, a)
					} else {
						queues[a] = q
						ready = append(ready, a)
					}
					continue
				}
				class := fault.ClassOf(err)
				d.failures.Add(1)
				d.mu.Lock()
				d.classes[class]++
				d.lastErr = err
				d.mu.Unlock()
				if class == fault.Permanent {
					return fmt.Errorf("event %s of aggregate %s failed as permanent, so the relay would dead-letter it; want unavailable or transient: %w", r.batch[i].ID, a, err)
				}
				attempts[a]++
				backoff := min(10*time.Millisecond<<min(attempts[a], 6), 500*time.Millisecond)
				time.AfterFunc(backoff, func() { retry <- a })
			}
		case a := <-retry:
			ready = append(ready, a)
		case <-paced:
		case <-ctx.Done():
			return fmt.Errorf("%d events not acknowledged (%d publish attempts failed, last: %v): %w", held, d.failures.Load(), d.lastError(), ctx.Err())
		}
	}
}

func (d *driver) lastError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

// summary describes the failed attempts, for logs.
func (d *driver) summary() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.classes) == 0 {
		return "no failed attempts"
	}
	return fmt.Sprintf("failed attempts by class %v, last error: %v", d.classes, d.lastErr)
}

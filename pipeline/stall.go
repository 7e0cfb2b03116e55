package pipeline

import (
	"sync"
	"time"
)

// StallAfter is how long a Publish call may wait for the broker before the
// sink is reported not ready (Stats.SinkReady), whichever the sink: a
// broker that neither acknowledges nor refuses for this long is treated as
// unreachable for readiness, though the call goes on (a sink gives up after
// its own timeout, e.g. Kafka's 15s). A call that carries the probe of a
// broken destination row values chose (sink.RowRouted) is not counted: one
// row's route does not make the relay not ready.
const StallAfter = 5 * time.Second

// publishing tracks the start of each Publish call in flight. It is safe
// for concurrent use.
type publishing struct {
	mu     sync.Mutex
	next   uint64
	starts map[uint64]time.Time
}

// begin records a call starting now and returns its handle for end.
func (p *publishing) begin(now time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.starts == nil {
		p.starts = map[uint64]time.Time{}
	}
	p.next++
	p.starts[p.next] = now
	return p.next
}

// end records that call id returned; an id of 0 is no call.
func (p *publishing) end(id uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.starts, id)
}

// longest returns how long the oldest call in flight has waited at now, or
// 0 when none is.
func (p *publishing) longest(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	for _, start := range p.starts {
		d = max(d, now.Sub(start))
	}
	return d
}

// PublishWait returns how long the oldest Publish call in flight has been
// waiting for the broker, or 0 when none is.
func (s *Stats) PublishWait() time.Duration { return s.publishing.longest(time.Now()) }

// SinkReady reports whether the sink is ready: Ready holds (no broker or
// fixed destination is broken, and the broken row-chosen destinations are
// not all there is) and no Publish call has waited longer than StallAfter.
// It is the one rule of readiness for every sink.
func (s *Stats) SinkReady() bool { return s.Ready.Load() && s.PublishWait() <= StallAfter }

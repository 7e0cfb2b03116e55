package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// allocsBefore is allocations per event of the relay before the work of
// docs/benchmarks.md "CPU and allocations per event" (measured by this
// bench, as allocsPerEvent, on the same machine): the allocation target is
// half of it.
var allocsBefore = map[string]float64{"poll": 63, "wal": 43}

// drainConsumer reads the bench stream during a drain, as an application
// would: a JetStream ordered consumer from the stream's first message,
// started as soon as the relay has created the stream.
type drainConsumer struct {
	e        *env
	received atomic.Int64
	stopc    chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	cc       jetstream.ConsumeContext
	err      error
}

// starter returns a relayStarter that starts `relay run` and then c.
func (c *drainConsumer) starter() relayStarter {
	return func(d *database, tag string) (*relayProc, error) {
		p, err := c.e.startRelay(d, tag)
		if err == nil {
			c.wg.Go(c.run)
		}
		return p, err
	}
}

// run waits for the stream and starts consuming it.
func (c *drainConsumer) run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		oc, err := c.e.js.OrderedConsumer(ctx, benchStream, jetstream.OrderedConsumerConfig{})
		if err == nil {
			cc, err := oc.Consume(func(jetstream.Msg) { c.received.Add(1) })
			c.mu.Lock()
			c.cc, c.err = cc, err
			c.mu.Unlock()
			return
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// stop waits up to wait for n messages, then stops consuming. It returns
// how many arrived and how long the wait took.
func (c *drainConsumer) stop(n int64, wait time.Duration) (int64, time.Duration, error) {
	t0 := time.Now()
	for c.received.Load() < n && time.Since(t0) < wait {
		time.Sleep(10 * time.Millisecond)
	}
	el := time.Since(t0)
	close(c.stopc)
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cc != nil {
		c.cc.Stop()
	}
	return c.received.Load(), el, c.err
}

// consumerDrain drains a backlog in d while a consumer reads the stream.
func (e *env) consumerDrain(ctx context.Context, d *database) (DrainResult, error) {
	c := &drainConsumer{e: e, stopc: make(chan struct{})}
	dr, err := e.measureDrain(ctx, d, 1, c.starter(), nil)
	dr.Consumer = true
	got, el, cerr := c.stop(int64(e.opts.Events), 30*time.Second)
	dr.ConsumerReceived = got
	dr.ConsumerCatchUpSecs = el.Seconds()
	e.opts.logf("%s → nats with a consumer: the consumer received %d messages, %.2fs after the drain", d.mode, got, el.Seconds())
	if err == nil && cerr != nil {
		err = fmt.Errorf("drain consumer: %w", cerr)
	}
	if err == nil && got < int64(e.opts.Events) {
		err = fmt.Errorf("drain consumer received %d of %d messages", got, e.opts.Events)
	}
	return dr, err
}

// printCPUTable prints the drains into NATS as one row per mode and
// consumer: the relay's rate, the baseline's, their ratio and the relay's
// costs per event.
func printCPUTable(w io.Writer, r *Results) {
	var rows []DrainResult
	for _, d := range r.Drains {
		if d.Sink == "nats" {
			rows = append(rows, d)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	t := newTable(w, "CPU AND ALLOCATIONS", "relay ev/s", "baseline ev/s", "ratio", "relay CPU s/100k", "allocs/event", "peak RSS MB", "consumer")
	for _, d := range rows {
		base := ""
		if b, ok := r.Baselines[baselineOf(d.Mode)]; ok {
			base = f0(b.PerSecond)
		}
		ratio, cons := "", "none"
		if d.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f×", d.Ratio)
		}
		if d.Consumer {
			cons = fmt.Sprintf("%d read, +%.1fs", d.ConsumerReceived, d.ConsumerCatchUpSecs)
		}
		name := d.Mode + " drain"
		if !d.Complete {
			name += " (INCOMPLETE)"
		}
		t.row(name, f0(d.Drain.PerSecond), base, ratio, f2(d.CPUPer100k), f1(d.AllocsPerEvent), f0(d.PeakRSSMB), cons)
	}
	t.flush()
}

// baselineOf names the baseline of a capture mode's drain.
func baselineOf(mode string) string {
	return map[string]string{"wal": "pgoutput", "poll": "delete"}[mode]
}

// cpuTargets are the CPU, allocation and ratio targets of the drains into
// NATS, with and without a consumer.
func cpuTargets(r *Results) []Target {
	var out []Target
	for _, d := range r.Drains {
		if d.Sink != "nats" || d.Relays != 1 {
			continue
		}
		name := d.Mode + " drain"
		if d.Consumer {
			name += ", consumer"
		}
		met := func(ok bool) string {
			if ok && d.Complete {
				return "met"
			}
			return "not met"
		}
		out = append(out, Target{Name: name + " CPU", Goal: "relay CPU ≤ 1.0 s per 100,000 events",
			Measured: fmt.Sprintf("%.2f s", d.CPUPer100k), Status: met(d.CPUPer100k <= 1.0)})
		if b := allocsBefore[d.Mode]; b > 0 && d.AllocsPerEvent > 0 {
			out = append(out, Target{Name: name + " allocs", Goal: fmt.Sprintf("allocations per event ≤ half of %.0f", b),
				Measured: fmt.Sprintf("%.1f", d.AllocsPerEvent), Status: met(d.AllocsPerEvent <= b/2)})
		}
		if d.Ratio > 0 {
			out = append(out, Target{Name: name + " ratio", Goal: "drain ≥ 0.6 × the same-run baseline (" + r.Baselines[baselineOf(d.Mode)].Name + ")",
				Measured: fmt.Sprintf("%.2f×", d.Ratio), Status: met(d.Ratio >= 0.6)})
		}
	}
	return out
}

package demo

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// stream runs the producers and waits until the consumer received every
// event they wrote, showing progress. It returns the time that took. The
// producers have stopped when it returns.
func (e *env) stream(ctx context.Context) (time.Duration, error) {
	fmt.Fprintf(e.opts.Out, "demo: %d producers write %d events over %d orders in concurrent transactions; "+
		"the relay polls the outbox into NATS stream %s\n", e.opts.Producers, e.opts.Events, e.opts.Aggregates, stream)
	begin := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	e.prod = newProducer(e.opts)
	go e.prod.run(ctx, e.pool)
	defer func() {
		cancel()
		<-e.prod.done
	}()
	err := e.await(ctx)
	return time.Since(begin), err
}

// await shows progress every 200ms until the producers are done and every
// event they wrote was consumed. It fails when a producer or the relay
// fails, or after eventTimeout.
func (e *env) await(ctx context.Context) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(eventTimeout)
	pl := newProgress(e.opts.Out, e.opts.Events)
	defer pl.end()
	produced := e.prod.done
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.rel.done:
			return fmt.Errorf("relay stopped: %v", e.rel.err)
		case <-timeout:
			return fmt.Errorf("timed out after %v: %d of %d events written, %d consumed",
				eventTimeout, e.prod.written.Load(), e.opts.Events, e.cons.consumed.Load())
		case <-produced:
			if e.prod.err != nil {
				return fmt.Errorf("producer: %w", e.prod.err)
			}
			produced = nil
		case <-tick.C:
		}
		written, consumed := e.prod.written.Load(), e.cons.consumed.Load()
		pl.show(written, e.rel.stats().Published.Load(), consumed)
		if produced == nil && consumed >= written {
			return nil
		}
	}
}

// verify stops the relay, lets the consumer read the rest of the stream and
// prints the summary when every event was received once in order per
// aggregate and the outbox is empty. Otherwise it returns an error naming
// each failed check.
func (e *env) verify(ctx context.Context, elapsed time.Duration) error {
	if err := e.rel.stop(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := e.cons.drain(ctx); err != nil {
		return err
	}
	failed := e.cons.check(e.prod.ids)
	var left int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&left); err != nil {
		return fmt.Errorf("count the outbox rows: %w", err)
	}
	if left > 0 {
		failed = append(failed, fmt.Sprintf("%d rows left in the outbox", left))
	}
	if len(failed) > 0 {
		return fmt.Errorf("demo: check failed: %s", strings.Join(failed, "; "))
	}
	n := len(e.prod.ids)
	fmt.Fprintf(e.opts.Out, "demo: %d events over %d aggregates in %.1fs (%s ev/s): all received, "+
		"per-aggregate order held, %d duplicates, outbox empty\n", n, min(e.opts.Aggregates, n),
		elapsed.Seconds(), thousands(int64(float64(n)/elapsed.Seconds())), e.cons.duplicateCount())
	return nil
}

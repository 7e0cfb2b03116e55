// Package demo implements `relay demo`: it starts a throwaway PostgreSQL
// cluster and an embedded NATS JetStream server, writes order events to the
// outbox from concurrent transactions, relays them with the real relay,
// consumes them from the stream and verifies that every event arrived, in
// order per aggregate. Everything it starts is stopped and its files are
// removed before Run returns, also when its context is cancelled.
package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"
)

// Options configures Run. Zero values take the defaults given on each field.
type Options struct {
	// Out receives the progress line and the summary. Default io.Discard.
	Out io.Writer
	// Events is how many outbox events the producers write. Default 20000.
	Events int
	// Aggregates is how many orders the events are spread over. Default 500.
	Aggregates int
	// Producers is how many goroutines write concurrently; producer p owns
	// the aggregates k with k % Producers == p. Default 8.
	Producers int
}

// setDefaults replaces zero and negative values with the defaults.
func (o *Options) setDefaults() {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Events <= 0 {
		o.Events = 20000
	}
	if o.Aggregates <= 0 {
		o.Aggregates = 500
	}
	if o.Producers <= 0 {
		o.Producers = 8
	}
}

// eventTimeout bounds the time from the first write until every event was
// consumed.
const eventTimeout = 60 * time.Second

// Run runs the demo and prints its progress and a verified summary to
// opts.Out. It returns an error naming every check that failed. When ctx is
// cancelled it stops everything, removes its files and returns ctx.Err().
func Run(ctx context.Context, opts Options) error {
	opts.setDefaults()
	var logs bytes.Buffer
	err := run(ctx, opts, &logs)
	switch {
	case err == nil:
		fmt.Fprintln(opts.Out, "demo: relay, NATS and PostgreSQL stopped, their files removed")
		return nil
	case ctx.Err() != nil:
		fmt.Fprintln(opts.Out, "\ndemo: interrupted; relay, NATS and PostgreSQL stopped, their files removed")
		return ctx.Err()
	case logs.Len() > 0:
		fmt.Fprintf(opts.Out, "\ndemo: relay log:\n%s", logs.Bytes())
	}
	return err
}

// run starts the servers, the relay and the consumer, streams the events
// and verifies them; every component is stopped before it returns. The
// relay's warnings and errors are written to logs.
func run(ctx context.Context, opts Options, logs io.Writer) error {
	e := &env{opts: opts}
	defer e.close()
	if err := e.startServers(ctx); err != nil {
		return err
	}
	if err := e.startClients(ctx, logs); err != nil {
		return err
	}
	elapsed, err := e.stream(ctx)
	if err != nil {
		return err
	}
	return e.verify(ctx, elapsed)
}

package nats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
)

// Publish sends every event of batch without waiting in between, then waits
// for each PubAck. It returns nil when all were acknowledged, including as
// duplicates of an earlier delivery, and a *sink.BatchError otherwise.
// A message over the server's max_payload or the stream's max message size,
// or with a header name NATS cannot carry, fails as sink.Permanent; a lost
// or closed connection, an ack timeout and ctx ending fail as
// sink.Unavailable; anything else, such as a subject no stream listens on,
// is transient. Publish is safe for concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	subjects := make([]string, len(batch))
	futures := make([]jetstream.PubAckFuture, len(batch))
	errs := make([]error, len(batch))
	for i, e := range batch {
		subjects[i] = s.subject.Render(e)
		futures[i], errs[i] = s.send(ctx, subjects[i], e)
	}
	failed := false
	for i, e := range batch {
		if futures[i] != nil {
			errs[i] = s.await(ctx, futures[i])
		}
		if errs[i] != nil {
			errs[i] = fmt.Errorf("publish %s to %s: %w", e.ID, subjects[i], classify(errs[i]))
			failed = true
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

// send publishes e asynchronously. When MaxInFlight messages await their
// acks it waits for a free slot, up to AckTimeout or ctx's deadline.
func (s *Sink) send(ctx context.Context, subject string, e *event.Event) (jetstream.PubAckFuture, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stall := s.opts.AckTimeout
	if dl, ok := ctx.Deadline(); ok {
		stall = max(min(stall, time.Until(dl)), time.Millisecond)
	}
	msg := &nats.Msg{Subject: subject, Header: headers(e), Data: e.Payload}
	return s.js.PublishMsgAsync(msg, jetstream.WithStallWait(stall))
}

// headers returns the message headers of e: its Headers map, overridden by
// the contract headers. The values share one backing array: one
// allocation per message instead of one per header.
func headers(e *event.Event) nats.Header {
	n := len(e.Headers) + 6
	h := make(nats.Header, n)
	vals := make([]string, 0, n)
	set := func(k, v string) {
		vals = append(vals, v)
		i := len(vals) - 1
		h[k] = vals[i : i+1 : i+1] // capped: an append must not overwrite the next value
	}
	for k, v := range e.Headers {
		set(k, v)
	}
	set(jetstream.MsgIDHeader, e.ID)
	set("message_id", e.ID)
	set("event_type", e.EventType)
	set("aggregate_type", e.AggregateType)
	set("aggregate_id", e.AggregateID)
	set("Content-Type", e.ContentType)
	return h
}

// errClosed fails the publishes waiting for acks when the sink is closed.
var errClosed = errors.New("nats sink closed")

func (s *Sink) await(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closed:
		return errClosed
	}
}

// classify marks err with its sink.Class. Errors not listed here, such as
// jetstream.ErrNoStreamResponse for a subject no stream covers, stay
// transient: the stream may yet be created or fixed.
func classify(err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum),
		errors.Is(err, nats.ErrBadHeaderMsg):
		return sink.AsPermanent(err)
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		// With the reconnect buffer disabled this means "reconnecting".
		return sink.AsUnavailable(nats.ErrConnectionReconnecting)
	case errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrStaleConnection),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled),
		errors.Is(err, errClosed),
		errors.As(err, new(net.Error)):
		return sink.AsUnavailable(err)
	}
	return err
}

package nats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// Publish sends every event of batch without waiting in between, then waits
// for each PubAck, up to AckTimeout after the last send. It returns nil when
// all were acknowledged, including as duplicates of an earlier delivery, and
// a *sink.BatchError otherwise. Errors are classified by classify. Publish
// is safe for concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	c := s.newCall(len(batch))
	defer s.release(c)
	subjects, w, msg, hs := c.subjects, &c.w, &c.msg, &c.hs
	stall := s.opts.AckTimeout
	if dl, ok := ctx.Deadline(); ok {
		stall = max(min(stall, time.Until(dl)), time.Millisecond)
	}
	deadline, stalled := time.Now().Add(stall), false
	for i, e := range batch {
		subjects[i] = s.subject.Render(e)
		if err := destname.NATSSubject(subjects[i]); err != nil {
			w.errs[i] = fault.AsPermanent(err)
			subjects[i] = "an invalid subject"
			continue
		}
		if stalled {
			w.errs[i] = jetstream.ErrTooManyStalledMsgs
			continue
		}
		if err := s.send(ctx, msg, hs, subjects[i], e, w, i, deadline); err != nil {
			w.errs[i] = err
			stalled = errors.Is(err, jetstream.ErrTooManyStalledMsgs)
		}
	}
	s.await(ctx, c)
	failed := false
	for i, e := range batch {
		if err := w.errs[i]; err != nil {
			w.errs[i] = fmt.Errorf("publish %s to %s: %w", e.ID, subjects[i], classify(err))
			failed = true
		}
	}
	if failed {
		errs := w.errs
		w.errs = nil // the caller keeps them
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

// call is what a Publish call works with. A call that ends puts it in the
// sink's pool for the next, which saves allocating the wait, the header
// map, the subjects and the ack timer for each small batch.
type call struct {
	w        ackWait
	hs       headerSet
	msg      nats.Msg // reused for each message: PublishMsg copies it out
	subjects []string
	timer    *time.Timer // stopped between uses
}

// newCall returns a call for a batch of n events, from the pool or new.
func (s *Sink) newCall(n int) *call {
	c, _ := s.calls.Get().(*call)
	if c == nil {
		c = &call{w: ackWait{done: make(chan struct{}, 1)}}
	}
	c.w.reset(n)
	if cap(c.subjects) < n {
		c.subjects = make([]string, n)
	}
	c.subjects = c.subjects[:n]
	return c
}

// release puts c in the pool without what it holds of its batch's events
// (payload, header values, subjects), so that a pooled call pins none of
// them. The header map keeps its names for the next batch.
func (s *Sink) release(c *call) {
	c.msg = nats.Msg{}
	clear(c.hs.vals)
	clear(c.subjects)
	s.calls.Put(c)
}

// send publishes e as message i of w in msg, with headers from hs. When
// MaxInFlight messages await their acks it waits for a free slot, until
// deadline. It returns an error when e was not sent.
func (s *Sink) send(ctx context.Context, msg *nats.Msg, hs *headerSet, subject string, e *event.Event, w *ackWait, i int, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkRowHeaderValues(e, s.rows); err != nil {
		return fault.AsPermanent(err)
	}
	*msg = nats.Msg{Subject: subject, Header: hs.headers(e, s.rows), Data: e.Payload}
	if env := s.opts.Envelope; env != nil {
		if err := env.Check(e); err != nil {
			return err
		}
		env.Binary(e, envelope.NATS, func(k, v string) { msg.Header[k] = []string{v} })
		hs.changed()
	}
	if n := headerBytes(msg.Header); n > maxHeaderBytes {
		return fault.AsPermanent(fmt.Errorf("the headers are %d bytes encoded, over JetStream's limit of %d", n, maxHeaderBytes))
	}
	return s.acks.send(ctx, msg, w, i, deadline, s.closed)
}

// maxHeaderBytes is the largest header block JetStream stores.
const maxHeaderBytes = 65535

// headerBytes returns about how many bytes h takes encoded, at least as
// many as it does.
func headerBytes(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + len(": \r\n")
		}
	}
	return n
}

// checkRowHeaderValues returns an error naming the first row header rows
// forwards whose value holds a control byte other than horizontal tab:
// NATS headers are CRLF-delimited text, and a NUL or another control byte
// would be stored and handed to every consumer as it is.
func checkRowHeaderValues(e *event.Event, rows *sink.HeaderFilter) error {
	for k, v := range e.Headers {
		i := strings.IndexFunc(v, func(r rune) bool { return (r < ' ' && r != '\t') || r == 0x7f })
		if i >= 0 && rows.Reason(k) == "" {
			return fmt.Errorf("row header %s: the value has the control byte %#02x at byte %d, which NATS headers cannot carry as text", rowtext.Label(k), v[i], i)
		}
	}
	return nil
}

// headerSet builds the headers of one message after another in one map and
// one array of values, which the NATS client encodes before PublishMsg
// returns and does not keep. When an event's row headers have the names of
// the previous event's, the map keeps its keys and only the values change.
// It is used by one goroutine.
type headerSet struct {
	h    nats.Header
	vals []string // the row headers' values, then the contract headers'
	rows int      // how many row headers h holds
	// same is set while h holds exactly the contract headers, at
	// vals[rows:], and rows row headers of other names.
	same bool
}

// contractHeaders are the names of the headers every message carries, in
// the order of their values in headerSet.vals.
var contractHeaders = [...]string{jetstream.MsgIDHeader, "message_id", "event_type", "aggregate_type", "aggregate_id", "Content-Type"}

// headers returns the message headers of e: the contract headers and the
// row headers rows forwards. They are valid until the next call; a caller
// that changes them calls changed.
func (hs *headerSet) headers(e *event.Event, rows *sink.HeaderFilter) nats.Header {
	if !hs.sameNames(e) {
		hs.build(e, rows)
	}
	c := hs.vals[hs.rows:]
	c[0], c[1], c[2], c[3], c[4], c[5] = e.ID, e.ID, e.EventType, e.AggregateType, e.AggregateID, e.ContentType
	return hs.h
}

// sameNames reports whether h holds the row headers of e's names, and then
// sets their values. A row header rows drops is never in h, so an event
// with one is built anew, and the drop counted.
func (hs *headerSet) sameNames(e *event.Event) bool {
	if !hs.same || len(e.Headers) != hs.rows {
		return false
	}
	for k, v := range e.Headers {
		slot, ok := hs.h[k]
		if !ok || slices.Contains(contractHeaders[:], k) {
			return false
		}
		slot[0] = v
	}
	return true
}

// build fills h with e's headers anew, the row headers rows forwards; the
// contract headers get their values from the caller.
func (hs *headerSet) build(e *event.Event, rows *sink.HeaderFilter) {
	if hs.h == nil {
		hs.h = make(nats.Header, len(e.Headers)+len(contractHeaders))
	}
	h := hs.h
	clear(h)
	// The map's values alias vals: it must not grow while being filled.
	if n := len(e.Headers) + len(contractHeaders); cap(hs.vals) < n {
		hs.vals = make([]string, 0, n)
	}
	hs.vals = hs.vals[:0]
	set := func(k, v string) {
		hs.vals = append(hs.vals, v)
		i := len(hs.vals) - 1
		h[k] = hs.vals[i : i+1 : i+1] // capped: an append must not overwrite the next value
	}
	for k, v := range e.Headers {
		if rows.Forward(k) {
			set(k, v)
		}
	}
	hs.rows = len(hs.vals)
	for _, k := range contractHeaders {
		set(k, "")
	}
	hs.same = len(h) == len(hs.vals)
}

// changed notes that the caller changed the headers last returned.
func (hs *headerSet) changed() { hs.same = false }

// errClosed fails the publishes waiting for acks when the sink is closed.
var errClosed = errors.New("nats sink closed")

// await waits until every message of c sent is settled. Those still
// waiting when AckTimeout passes, ctx ends or the sink closes fail.
func (s *Sink) await(ctx context.Context, c *call) {
	s.acks.sent(&c.w)
	if c.timer == nil {
		c.timer = time.NewTimer(s.opts.AckTimeout)
	} else {
		c.timer.Reset(s.opts.AckTimeout)
	}
	defer c.timer.Stop()
	if err := s.acks.wait(ctx, &c.w, c.timer, s.closed); err != nil {
		s.acks.abandon(&c.w, err)
	}
}

// classify marks err with its fault.Class. A message over the server's
// max_payload, the stream's max message size, what its store takes or JetStream's header limit,
// or with a header name NATS cannot carry, or an event the envelope
// rejects, is permanent. A failure of the destination is
// unavailable: a lost or closed connection, an ack timeout, ctx ending,
// failed authentication or authorization, a missing stream, and no
// responders (no stream covers the subject). Anything else is transient and
// suspect (fault.AsSuspect): it counts against the event only while other
// events to the subject succeed.
func classify(err error) error {
	switch {
	case fault.ClassOf(err) == fault.Permanent:
		return err
	case errors.Is(err, nats.ErrMaxPayload),
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum),
		errors.Is(err, nats.ErrBadHeaderMsg),
		isAPIError(err, errHeaderTooLarge),
		tooLargeToStore(err):
		return fault.AsPermanent(err)
	case errors.Is(err, nats.ErrReconnectBufExceeded):
		// With the reconnect buffer disabled this means "reconnecting".
		return fault.AsUnavailable(nats.ErrConnectionReconnecting)
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
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, nats.ErrAuthorization),
		errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked),
		errors.Is(err, nats.ErrPermissionViolation),
		errors.As(err, new(net.Error)):
		return fault.AsUnavailable(err)
	}
	return fault.AsSuspect(err)
}

// errHeaderTooLarge is JetStream's error code for a message whose headers
// are over its limit.
const errHeaderTooLarge jetstream.ErrorCode = 10097

// isAPIError reports whether err is a JetStream API error with code.
func isAPIError(err error, code jetstream.ErrorCode) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == code
}

// errStoreFailed is JetStream's error code for a message the stream could
// not store.
const errStoreFailed jetstream.ErrorCode = 10077

// tooLargeToStore reports whether err is JetStream refusing to store a
// message for its size: a file store takes none over 32 MiB, whatever the
// server's max_payload.
func tooLargeToStore(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == errStoreFailed && ae.Description == "message too large"
}

// DestinationOf returns the subject of e.
func (s *Sink) DestinationOf(e *event.Event) string { return s.subject.Render(e) }

// RowChosen implements sink.RowRouted: true when the subject template has a
// placeholder.
func (s *Sink) RowChosen() bool { return !s.subject.Fixed() }

// Probe asks JetStream, without publishing: for sink.Broker, the account
// information (the server answers and JetStream is enabled for this
// account); for a subject, which stream covers it. Its errors are
// classified like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	if dest == sink.Broker {
		if _, err := s.js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("nats account info: %w", classify(err))
		}
		return nil
	}
	if _, err := s.js.StreamNameBySubject(ctx, dest); err != nil {
		return fmt.Errorf("nats: no stream for subject %s: %w", dest, classify(err))
	}
	return nil
}

var (
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// errConfirmTimeout fails the events whose confirm, or the operations
// whose answer, did not come within Options.ConfirmTimeout.
var errConfirmTimeout = errors.New("no answer from the broker within the confirm timeout; the connection was dropped")

// Publish sends every event of batch and returns nil when the broker
// confirmed each and returned none as unroutable, and a *sink.BatchError
// otherwise, classified by classify. It sends in waves: the first event
// of each ordering key (event.Event.Key), each to its exchange's channel
// without waiting in between, then waits for their confirms; the next
// event of a key goes in the next wave, once the one before it was
// confirmed. When an event fails, the later events of its key are not sent
// and fail as sink.ErrHeldBack carrying its error. When a confirm does not
// come within ConfirmTimeout of a wave's last send, the sink drops the
// connection with a TCP reset and fails the unconfirmed events as the
// destination's fault. Publish is safe for concurrent use.
//
// A key's next event waits for the confirm of the one before it because
// one channel keeps the order of what it stores, not of what it refuses:
// a message returned as unroutable or nacked (a queue at its length limit)
// does not stop a later one of its key, sent behind it, from being
// routed and stored first once a binding appears or the queue drains.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	errs := make([]error, len(batch))
	next, wave := keyChains(batch)
	for len(wave) > 0 {
		s.sendWave(ctx, batch, wave, errs)
		var following []int
		for _, i := range wave {
			switch {
			case errs[i] != nil:
				errs[i] = classify(errs[i])
				for j := next[i]; j >= 0; j = next[j] {
					errs[j] = fmt.Errorf("%w (%w)", sink.ErrHeldBack, errs[i])
				}
			case next[i] >= 0:
				following = append(following, next[i])
			}
		}
		wave = following
	}
	failed := false
	for i, e := range batch {
		if errs[i] != nil {
			errs[i] = fmt.Errorf("publish %s to %s: %w", e.ID, s.DestinationOf(e), errs[i])
			failed = true
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

// keyChains returns, for each event of batch, the index of the next event
// of its ordering key (-1 for none), and the indexes of each key's first
// event.
func keyChains(batch []*event.Event) (next, firsts []int) {
	next = make([]int, len(batch))
	last := make(map[string]int, len(batch))
	for i, e := range batch {
		next[i] = -1
		if j, ok := last[e.Key()]; ok {
			next[j] = i
		} else {
			firsts = append(firsts, i)
		}
		last[e.Key()] = i
	}
	return next, firsts
}

// sendWave sends the events of batch at the indexes of wave and sets their
// errs once each was confirmed or failed.
func (s *Sink) sendWave(ctx context.Context, batch []*event.Event, wave []int, errs []error) {
	c, err := s.connection(ctx)
	if err != nil {
		for _, i := range wave {
			errs[i] = err
		}
		return
	}
	waiters := make([]*waiter, len(wave))
	werrs := make([]error, len(wave))
	for k, i := range wave {
		e := batch[i]
		waiters[k], werrs[k] = s.send(ctx, c, e, s.exchange.Render(e), s.key.Render(e))
	}
	s.await(ctx, c, waiters, werrs)
	for k, i := range wave {
		errs[i] = werrs[k]
	}
}

// send publishes e and returns the waiter of its confirm.
func (s *Sink) send(ctx context.Context, c *conn, e *event.Event, exchange, key string) (*waiter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	msg, err := s.message(e, c.frameMax)
	if err != nil {
		return nil, err
	}
	if err := c.checkExchange(ctx, exchange); err != nil {
		return nil, err
	}
	var p *pubChan
	if len(msg.Body) > soloBytes {
		p, err = c.open(true)
	} else {
		p, err = c.channel(s.channelFor(exchange))
	}
	if err != nil {
		return nil, err
	}
	w := &waiter{id: e.ID, size: len(msg.Body), done: make(chan error, 1)}
	if err := p.publish(ctx, exchange, key, msg, w); err != nil {
		return nil, err
	}
	return w, nil
}

// await fills errs with the outcome of each waiter, waiting at most
// ConfirmTimeout and until ctx ends or the sink closes.
func (s *Sink) await(ctx context.Context, c *conn, waiters []*waiter, errs []error) {
	timer := time.NewTimer(s.opts.ConfirmTimeout)
	defer timer.Stop()
	var stop error // once set, waiters still unresolved fail with it
	for i, w := range waiters {
		if w == nil {
			continue
		}
		if stop == nil {
			select {
			case errs[i] = <-w.done:
				continue
			case <-timer.C:
				stop = errConfirmTimeout
				c.abort(errConfirmTimeout)
			case <-ctx.Done():
				stop = context.Cause(ctx)
			case <-s.closed:
				stop = errClosed
			}
		}
		select {
		case errs[i] = <-w.done:
		default:
			errs[i] = stop
		}
	}
}

// waiter is one sent message awaiting its confirm.
type waiter struct {
	id   string
	size int        // body bytes
	done chan error // receives the outcome once
}

// conn is one AMQP connection and its publishing channels.
type conn struct {
	s        *Sink
	ac       *amqp.Connection
	raw      *deadlineConn
	frameMax int

	mu     sync.Mutex
	chans  []*pubChan
	known  map[string]bool // exchanges found to exist on this connection
	dead   chan struct{}   // closed when the connection is lost or closed
	err    error           // why, set before dead is closed
	closer sync.Once
}

// close marks the connection lost for err and closes it: gracefully (one
// second at most) when the sink closes, else at once.
func (c *conn) close(err error) {
	c.closer.Do(func() {
		c.err = err
		close(c.dead)
		if c.ac == nil {
			return
		}
		if errors.Is(err, errClosed) {
			c.ac.CloseDeadline(time.Now().Add(time.Second))
		}
		c.raw.abort()
	})
}

// abort drops the connection with a TCP reset, for a confirm that never
// came: what the sink wrote and the kernel did not send yet is discarded,
// so that it cannot reach the broker after a later publish over a new
// connection.
func (c *conn) abort(err error) {
	c.s.opts.Logger.Warn("rabbitmq: dropping the connection", "url", c.s.safeURL(), "reason", err)
	c.close(err)
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// checkExchange returns nil when exchange exists, checking it with a
// passive declare on a channel of its own the first time on this
// connection: publishing to a missing exchange would close the publishing
// channel and fail the other events in flight on it.
func (c *conn) checkExchange(ctx context.Context, exchange string) error {
	if exchange == "" {
		return nil
	}
	c.mu.Lock()
	ok := c.known[exchange]
	c.mu.Unlock()
	if ok {
		return nil
	}
	if err := c.passive(ctx, exchange); err != nil {
		return err
	}
	c.mu.Lock()
	if c.known == nil {
		c.known = map[string]bool{}
	}
	c.known[exchange] = true
	c.mu.Unlock()
	return nil
}

// forget drops exchange from the exchanges known to exist.
func (c *conn) forget(exchange string) {
	c.mu.Lock()
	delete(c.known, exchange)
	c.mu.Unlock()
}

// passive declares exchange passively on a channel opened for it.
func (c *conn) passive(ctx context.Context, exchange string) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(exchange, "", false, false, false, false, nil)
	})
}

// withChannel runs f on a channel opened for it and closed after, failing
// when ctx ends first (the channel is then left to the connection). When
// no answer comes within ConfirmTimeout the connection is dropped, as for
// a confirm that never comes.
func (c *conn) withChannel(ctx context.Context, f func(*amqp.Channel) error) error {
	timer := time.NewTimer(c.s.opts.ConfirmTimeout)
	defer timer.Stop()
	done := make(chan error, 1)
	go func() {
		ch, err := c.ac.Channel()
		if err != nil {
			done <- err
			return
		}
		err = f(ch)
		if !ch.IsClosed() {
			ch.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-c.dead:
		return c.err
	case <-timer.C:
		c.abort(errConfirmTimeout)
		return errConfirmTimeout
	}
}

// channel returns the open publishing channel of slot, opening one in
// confirm mode when there is none.
func (c *conn) channel(slot int) (*pubChan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.chans[slot]; p != nil && p.isOpen() {
		return p, nil
	}
	p, err := c.open(false)
	if err != nil {
		return nil, err
	}
	c.chans[slot] = p
	return p, nil
}

// soloBytes is the body size above which a message goes over a channel of
// its own, closed after its confirm: a broker whose max_message_size is
// lower than sink.rabbitmq.max_message_bytes refuses it by closing the
// channel, which then takes no other event with it.
const soloBytes = 64 << 10

// open opens a channel in confirm mode; a solo channel carries one
// message and closes after its confirm.
func (c *conn) open(solo bool) (*pubChan, error) {
	ch, err := c.ac.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &pubChan{c: c, ch: ch, solo: solo, pending: map[uint64]*waiter{}, early: map[uint64]bool{}, returned: map[string]amqp.Return{}}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go p.run(confirms, returns, closes)
	return p, nil
}

// pubChan is a channel in confirm mode and the messages awaiting their
// confirms on it.
type pubChan struct {
	c    *conn
	ch   *amqp.Channel
	solo bool // carries one message

	mu       sync.Mutex
	pending  map[uint64]*waiter     // by delivery tag
	early    map[uint64]bool        // confirms (ack or nack) that came before their waiter was registered
	returned map[string]amqp.Return // returned messages by message_id, until their confirm
	err      error                  // why the channel closed; set once
}

func (p *pubChan) isOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err == nil
}

// publish sends msg with the mandatory flag and registers w for its
// confirm.
func (p *pubChan) publish(ctx context.Context, exchange, key string, msg amqp.Publishing, w *waiter) error {
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	tag := dc.DeliveryTag
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return err
	}
	ack, early := p.early[tag]
	if !early {
		p.pending[tag] = w
		p.mu.Unlock()
		return nil
	}
	delete(p.early, tag)
	ret, returned := p.returned[w.id]
	delete(p.returned, w.id)
	p.mu.Unlock()
	w.done <- outcome(ack, ret, returned)
	return nil
}

// run takes the channel's returns and confirms, in the order the client
// library hands them over, until the channel closes, then fails what
// still waits. The broker sends the basic.return of an unroutable message
// before its basic.ack, and the library passes each to an unbuffered Go
// channel that only run reads, so a return is recorded before the confirm
// of its message is looked at.
func (p *pubChan) run(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	for confirms != nil || returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.mu.Lock()
			p.returned[r.MessageId] = r
			p.mu.Unlock()
		case cf, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			p.confirm(cf)
			if p.solo {
				go p.ch.Close()
			}
		}
	}
	var err error = amqp.ErrClosed
	if e, ok := <-closes; ok && e != nil {
		err = e
	}
	p.fail(err)
}

// confirm resolves the waiter of cf's delivery tag, or keeps cf for it.
func (p *pubChan) confirm(cf amqp.Confirmation) {
	p.mu.Lock()
	w := p.pending[cf.DeliveryTag]
	if w == nil {
		p.early[cf.DeliveryTag] = cf.Ack
		p.mu.Unlock()
		return
	}
	delete(p.pending, cf.DeliveryTag)
	ret, returned := p.returned[w.id]
	delete(p.returned, w.id)
	p.mu.Unlock()
	w.done <- outcome(cf.Ack, ret, returned)
}

// outcome is the result of a message the broker acked or nacked, and
// returned or not.
func outcome(ack bool, ret amqp.Return, returned bool) error {
	switch {
	case returned:
		return &returnError{ret}
	case !ack:
		return errNack
	}
	return nil
}

// errNack is a basic.nack: the broker refused the message (a queue at its
// length limit with overflow reject-publish, a queue without a quorum).
var errNack = errors.New("the broker refused the message (basic.nack)")

// returnError is a message the broker returned (basic.return).
type returnError struct{ r amqp.Return }

func (e *returnError) Error() string {
	return fmt.Sprintf("the broker returned the message: %d %s (exchange %q, routing key %q: no queue is bound for it)",
		e.r.ReplyCode, e.r.ReplyText, e.r.Exchange, e.r.RoutingKey)
}

// fail fails every waiter of the closed channel with err: the one the
// error names as too large with the size error, the others as lost with
// the channel.
func (p *pubChan) fail(err error) {
	p.mu.Lock()
	p.err = err
	pending := p.pending
	p.pending = nil
	p.mu.Unlock()
	if exch := notFoundExchange(err); exch != "" {
		p.c.forget(exch)
	}
	size := tooLargeSize(err)
	var first uint64
	for tag, w := range pending {
		if w.size == size && (first == 0 || tag < first) {
			first = tag
		}
	}
	for tag, w := range pending {
		switch {
		case size >= 0 && tag == first:
			w.done <- err
		case size >= 0:
			w.done <- fmt.Errorf("channel closed by the broker for an earlier message: %w", fault.AsUnavailable(amqp.ErrClosed))
		default:
			w.done <- err
		}
	}
}

// tooLargeRE matches RabbitMQ's refusal of a message over max_message_size.
var tooLargeRE = regexp.MustCompile(`message size (\d+) is larger than configured max size`)

// tooLargeSize returns the body size a channel error refuses as too
// large, or -1.
func tooLargeSize(err error) int {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return -1
	}
	m := tooLargeRE.FindStringSubmatch(ae.Reason)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// notFoundRE matches RabbitMQ's NOT_FOUND for a missing exchange.
var notFoundRE = regexp.MustCompile(`no exchange '(.*)' in vhost`)

// notFoundExchange returns the exchange a channel error reports missing,
// or "".
func notFoundExchange(err error) string {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return ""
	}
	if m := notFoundRE.FindStringSubmatch(ae.Reason); m != nil {
		return m[1]
	}
	return ""
}

// classify marks err with its fault.Class:
//
//   - the event's fault (permanent): a body over max_message_bytes or the
//     broker's max_message_size (406 PRECONDITION_FAILED "message size ...
//     is larger than configured max size"), headers that do not fit a
//     frame or an AMQP short string, an event the envelope rejects;
//   - the destination's fault (unavailable): a message returned as
//     unroutable (312 NO_ROUTE), a missing exchange (404 NOT_FOUND),
//     refused credentials or permissions (403 ACCESS_REFUSED, 530
//     NOT_ALLOWED for a virtual host), a broker shutting down (320
//     CONNECTION_FORCED), any other connection or channel error, a lost
//     or refused connection, a confirm timeout, ctx ending;
//   - a basic.nack and any other error: transient and suspect
//     (fault.AsSuspect), counted against the event only while other
//     events to the destination succeed.
func classify(err error) error {
	if fault.ClassOf(err) != fault.Transient || fault.IsSuspect(err) {
		return err
	}
	var ae *amqp.Error
	var ret *returnError
	switch {
	case tooLargeSize(err) >= 0:
		return fault.AsPermanent(err)
	case errors.As(err, &ret):
		return fault.AsUnavailable(err)
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed:
		return fault.AsSuspect(err)
	case errors.As(err, &ae),
		errors.Is(err, amqp.ErrClosed),
		errors.Is(err, errClosed),
		errors.Is(err, errConfirmTimeout),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, new(net.Error)):
		return fault.AsUnavailable(err)
	}
	return fault.AsSuspect(err)
}

// DestinationOf returns "exchange/routing key" of e; an exchange name
// never holds '/'.
func (s *Sink) DestinationOf(e *event.Event) string {
	return s.exchange.Render(e) + "/" + s.key.Render(e)
}

// RowChosen implements sink.RowRouted: true when the exchange or routing
// key template has a placeholder.
func (s *Sink) RowChosen() bool { return !s.exchange.Fixed() || !s.key.Fixed() }

// Probe checks, without publishing: for sink.Broker, that the sink can
// connect; for a destination, that its exchange exists (whether a queue is
// bound for its routing key only a publish can tell). Its errors are
// classified like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	c, err := s.connection(ctx)
	if err != nil || dest == sink.Broker {
		return err
	}
	exchange, _, _ := strings.Cut(dest, "/")
	if exchange == "" {
		return nil
	}
	if err := c.passive(ctx, exchange); err != nil {
		c.forget(exchange)
		return fmt.Errorf("rabbitmq exchange %q: %w", exchange, classify(err))
	}
	return nil
}

// MaxPerAggregate implements sink.Ordered with Options.MaxPerAggregate:
// Publish sends the events of one ordering key one after the other, each
// after the confirm of the one before it.
func (s *Sink) MaxPerAggregate() int { return s.opts.MaxPerAggregate }

var (
	_ sink.Ordered      = (*Sink)(nil)
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

package nats

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// acker publishes messages with a reply subject of its own and matches the
// JetStream PubAcks that come back to the Publish calls waiting for them.
// It is what jetstream.PublishMsgAsync does, with one wait per Publish
// call instead of one future, timer and pair of channels per message, and
// a PubAck read without reflection. At most max messages await their acks
// at once, each in a slot of its own.
//
// The client's reading goroutine hands each PubAck straight to a waiting
// Publish call through the channel acks, without a delivery goroutine in
// between: whichever call is waiting, for its acks or for room in the
// window, reads the acks that come and settles them for whichever call
// they belong to. Safe for concurrent use.
type acker struct {
	nc     *nats.Conn
	prefix string // reply subjects are prefix + a decimal token
	sub    *nats.Subscription
	acks   chan *nats.Msg // the PubAcks not yet read
	window chan struct{}  // one element per message awaiting its ack

	mu     sync.Mutex
	issued uint64 // tokens handed out so far
	// slots holds the messages awaiting their acks: the token of the one in
	// slot k is k plus a multiple of len(slots), and no token is used twice.
	slots []ackSlot
	free  []int // the unused slots
}

// ackSlot is where the ack of one message goes: message i of w. token is
// zero while the slot is unused.
type ackSlot struct {
	token uint64
	w     *ackWait
	i     int
}

// ackWait collects the acks of one Publish call. errs[i] is message i's
// error; left counts the messages still waiting (and the call while it
// sends), and done receives a value when it reaches zero. A call that
// ends reuses it for the next (reset).
type ackWait struct {
	errs  []error
	left  int
	done  chan struct{} // buffered: settling never blocks
	reply []byte        // the reply subject of the message being sent
}

// newAcker subscribes to the reply subjects of nc's PubAcks. The
// subscription ends when nc closes, the watch for reconnects when nc or
// closed does.
func newAcker(nc *nats.Conn, max int, closed <-chan struct{}) (*acker, error) {
	a := &acker{
		nc:     nc,
		prefix: nc.NewInbox() + ".", // under the connection's inbox prefix
		window: make(chan struct{}, max),
		slots:  make([]ackSlot, max),
		free:   make([]int, max),
	}
	for k := range a.free {
		a.free[k] = k
	}
	// The acks of the window's messages, and late ones of messages given
	// up on, fit; one beyond is dropped (and logged as a slow consumer).
	a.acks = make(chan *nats.Msg, 4*max+1024)
	sub, err := nc.ChanSubscribe(a.prefix+"*", a.acks)
	if err != nil {
		return nil, err
	}
	a.sub = sub
	status := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	go a.watch(status, closed)
	return a, nil
}

// watch fails every message awaiting its ack when the connection is lost:
// the acks of messages sent on it never arrive. It returns when the
// connection or the sink closes (the client may drop a status change).
func (a *acker) watch(status chan nats.Status, closed <-chan struct{}) {
	defer a.nc.RemoveStatusListener(status)
	for {
		select {
		case st, ok := <-status:
			if !ok {
				return
			}
			a.failAll(nats.ErrDisconnected)
			if st == nats.CLOSED {
				return
			}
		case <-closed:
			return
		}
	}
}

// newWait returns the wait of a Publish call of n messages.
func newWait(n int) *ackWait {
	w := &ackWait{done: make(chan struct{}, 1)}
	w.reset(n)
	return w
}

// reset readies w for a Publish call of n messages, counting the call
// itself as waiting until sent. No message of w may still be waiting. It
// reuses errs unless the last call handed them out (set errs to nil).
func (w *ackWait) reset(n int) {
	if cap(w.errs) < n {
		w.errs = make([]error, n)
	}
	w.errs = w.errs[:n]
	clear(w.errs)
	w.left = 1
	select {
	case <-w.done:
	default:
	}
}

// settled counts one message or the call's sends as settled; a.mu is held.
func (w *ackWait) settled() {
	if w.left--; w.left == 0 {
		w.done <- struct{}{}
	}
}

// sent marks the end of w's sends: w is done once every message sent is
// settled.
func (a *acker) sent(w *ackWait) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w.settled()
}

// send publishes msg as message i of w with a reply subject of the acker,
// after waiting until deadline for a free place in the window. It returns
// an error when the window stayed full or ctx or closed ended the wait; a
// failed send settles message i with the error.
func (a *acker) send(ctx context.Context, msg *nats.Msg, w *ackWait, i int, deadline time.Time, closed <-chan struct{}) error {
	if err := a.enter(ctx, deadline, closed); err != nil {
		return err
	}
	k, token := a.add(w, i)
	// PublishMsg copies the reply subject into its buffer before it
	// returns, so the subject can live in w's buffer, rewritten for each
	// message, instead of a new string per message.
	w.reply = strconv.AppendUint(append(w.reply[:0], a.prefix...), token, 10)
	msg.Reply = unsafe.String(unsafe.SliceData(w.reply), len(w.reply))
	err := a.nc.PublishMsg(msg)
	msg.Reply = ""
	if err != nil {
		a.mu.Lock()
		if a.slots[k].token == token {
			a.settle(k, err)
		}
		a.mu.Unlock()
	}
	return nil
}

// enter takes a place in the window, reading acks while it waits for one,
// until deadline or until ctx or closed end the wait.
func (a *acker) enter(ctx context.Context, deadline time.Time, closed <-chan struct{}) error {
	select {
	case a.window <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		select {
		case a.window <- struct{}{}:
			return nil
		case m := <-a.acks:
			a.received(m)
		case <-t.C:
			return jetstream.ErrTooManyStalledMsgs
		case <-ctx.Done():
			return ctx.Err()
		case <-closed:
			return errClosed
		}
	}
}

// wait reads acks until w is done, and returns nil then, or returns
// jetstream.ErrAsyncPublishTimeout when t fires first, or the reason when
// ctx or closed end the wait.
func (a *acker) wait(ctx context.Context, w *ackWait, t *time.Timer, closed <-chan struct{}) error {
	for {
		select {
		case <-w.done:
			return nil
		case m := <-a.acks:
			a.received(m)
		case <-t.C:
			return jetstream.ErrAsyncPublishTimeout
		case <-ctx.Done():
			return ctx.Err()
		case <-closed:
			return errClosed
		}
	}
}

// add puts message i of w in a free slot and returns the slot and the
// message's token. The caller holds a place in the window, which
// guarantees a free slot.
func (a *acker) add(w *ackWait, i int) (int, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	a.issued++
	token := a.issued*uint64(len(a.slots)) + uint64(k)
	a.slots[k] = ackSlot{token: token, w: w, i: i}
	w.left++
	return k, token
}

// received settles the message whose reply subject m was sent to.
func (a *acker) received(m *nats.Msg) {
	token, err := strconv.ParseUint(m.Subject[min(len(a.prefix), len(m.Subject)):], 10, 64)
	if err != nil {
		return
	}
	k := int(token % uint64(len(a.slots)))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.slots[k].token == token {
		a.settle(k, ackError(m))
	}
}

// settle records err as the outcome of the message in slot k and frees the
// slot; a.mu is held.
func (a *acker) settle(k int, err error) {
	s := a.slots[k]
	a.slots[k] = ackSlot{}
	a.free = append(a.free, k)
	<-a.window
	s.w.errs[s.i] = err
	s.w.settled()
}

// abandon settles every message of w still waiting with err.
func (a *acker) abandon(w *ackWait, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, s := range a.slots {
		if s.w == w {
			a.settle(k, err)
		}
	}
}

// failAll settles every message waiting with err.
func (a *acker) failAll(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, s := range a.slots {
		if s.token != 0 {
			a.settle(k, err)
		}
	}
}

var (
	ackErrorKey  = []byte(`"error"`)
	ackStreamKey = []byte(`"stream"`)
)

// ackError reads a PubAck: nil for an acknowledgement (also of a
// duplicate), the server's *jetstream.APIError for a refusal, and the
// errors jetstream.PublishMsgAsync returns for anything else: an empty
// answer with status 503 is no responders (no stream covers the subject).
// Only an answer that mentions "error" is decoded as JSON.
func ackError(m *nats.Msg) error {
	if len(m.Data) == 0 {
		if m.Header.Get("Status") == "503" {
			return jetstream.ErrNoStreamResponse
		}
		return jetstream.ErrInvalidJSAck
	}
	if bytes.Contains(m.Data, ackErrorKey) {
		var r struct {
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return jetstream.ErrInvalidJSAck
		}
		if r.Error != nil {
			return r.Error
		}
	}
	if !bytes.Contains(m.Data, ackStreamKey) {
		return jetstream.ErrInvalidJSAck
	}
	return nil
}

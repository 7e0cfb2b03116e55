package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// consumer reads the stream with an ordered consumer and checks every
// delivery against the contract.
type consumer struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	cc       jetstream.ConsumeContext
	consumed atomic.Int64  // distinct message_ids received
	lastSeq  atomic.Uint64 // stream sequence of the last message handled

	mu          sync.Mutex
	seen        map[string]bool // message_ids received
	last        map[string]int  // aggregate_id -> step of its last first delivery
	duplicates  int
	orderBreaks []string // the first deliveries out of order, described
	malformed   []string // deliveries whose headers or payload are wrong, described
}

// startConsumer connects to NATS and consumes the whole stream from its
// start until stop is called.
func startConsumer(ctx context.Context, url string) (*consumer, error) {
	nc, err := nats.Connect(url, nats.Name("relay-demo-consumer"))
	if err != nil {
		return nil, fmt.Errorf("consumer: connect to NATS: %w", err)
	}
	c := &consumer{nc: nc, seen: map[string]bool{}, last: map[string]int{}}
	if err := c.consume(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("consumer: %w", err)
	}
	return c, nil
}

// consume starts an ordered consumer on the whole stream.
func (c *consumer) consume(ctx context.Context) error {
	var err error
	if c.js, err = jetstream.New(c.nc); err != nil {
		return err
	}
	oc, err := c.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	c.cc, err = oc.Consume(c.handle)
	return err
}

// stop stops consuming and closes the connection.
func (c *consumer) stop() {
	c.cc.Stop()
	c.nc.Close()
}

// payload is the part of an event's body the consumer checks.
type payload struct {
	Order string `json:"order"`
	Step  int    `json:"step"`
}

// handle records one delivery.
func (c *consumer) handle(m jetstream.Msg) {
	if meta, err := m.Metadata(); err == nil {
		defer c.lastSeq.Store(meta.Sequence.Stream)
	}
	id := m.Headers().Get("message_id")
	p, problem := parse(m)
	c.mu.Lock()
	defer c.mu.Unlock()
	if problem != "" {
		c.malformed = append(c.malformed, problem)
	}
	if c.seen[id] {
		c.duplicates++
		return
	}
	c.seen[id] = true
	c.consumed.Add(1)
	if problem == "" {
		c.checkOrder(p)
	}
}

// checkOrder records a first delivery of p that is not newer than the
// previous first delivery of its order. The caller holds c.mu.
func (c *consumer) checkOrder(p payload) {
	if p.Step <= c.last[p.Order] {
		c.orderBreaks = append(c.orderBreaks, fmt.Sprintf("%s step %d after step %d", p.Order, p.Step, c.last[p.Order]))
	}
	c.last[p.Order] = p.Step
}

// parse returns the payload of m, or a description of what is wrong with
// m: an unreadable payload, message_id differing from Nats-Msg-Id, or an
// aggregate_id header differing from the payload's order.
func parse(m jetstream.Msg) (payload, string) {
	h := m.Headers()
	id := h.Get("message_id")
	var p payload
	switch err := json.Unmarshal(m.Data(), &p); {
	case err != nil || p.Order == "":
		return p, fmt.Sprintf("message %s: payload %q", id, m.Data())
	case id != h.Get(jetstream.MsgIDHeader):
		return p, fmt.Sprintf("message_id %s but Nats-Msg-Id %s", id, h.Get(jetstream.MsgIDHeader))
	case p.Order != h.Get("aggregate_id"):
		return p, fmt.Sprintf("message %s: aggregate_id %s for order %s", id, h.Get("aggregate_id"), p.Order)
	}
	return p, ""
}

// duplicateCount returns how many deliveries repeated a message_id.
func (c *consumer) duplicateCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.duplicates
}

// drain waits until the consumer handled every message in the stream.
func (c *consumer) drain(ctx context.Context) error {
	str, err := c.js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	want := str.CachedInfo().State.LastSeq
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for c.lastSeq.Load() < want {
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumer: read up to stream sequence %d of %d", c.lastSeq.Load(), want)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// check compares what was received with the ids written and returns what
// is wrong, one description per failed check.
func (c *consumer) check(written []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var failed []string
	var missing []string
	for _, id := range written {
		if !c.seen[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		failed = append(failed, fmt.Sprintf("%d of %d events never received (first: %s)", len(missing), len(written), missing[0]))
	}
	if len(c.orderBreaks) > 0 {
		failed = append(failed, fmt.Sprintf("per-aggregate order broken %d times (first: %s)", len(c.orderBreaks), c.orderBreaks[0]))
	}
	if len(c.malformed) > 0 {
		failed = append(failed, fmt.Sprintf("%d malformed deliveries (first: %s)", len(c.malformed), c.malformed[0]))
	}
	return failed
}

package nats

import (
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

// testAcker is an acker of n slots without a connection.
func testAcker(n int) *acker {
	a := &acker{prefix: "_INBOX.x.", window: make(chan struct{}, n), slots: make([]ackSlot, n)}
	for k := range n {
		a.free = append(a.free, k)
	}
	return a
}

// sendTo adds message i of w as send does and returns its token.
func sendTo(a *acker, w *ackWait, i int) uint64 {
	a.window <- struct{}{}
	_, token := a.add(w, i)
	return token
}

func ackFor(a *acker, token uint64, data string) *nats.Msg {
	return &nats.Msg{Subject: a.prefix + strconv.FormatUint(token, 10), Data: []byte(data)}
}

// TestAckSlotsReused: slots are reused, and an ack that comes again for a
// token whose message was settled, or for a token never handed out,
// settles nothing, not the message now in the same slot.
func TestAckSlotsReused(t *testing.T) {
	a := testAcker(2)
	first, second := newWait(2), newWait(3)
	t1 := sendTo(a, first, 0)
	t2 := sendTo(a, first, 1)
	a.received(ackFor(a, t1, `{"stream":"S","seq":1}`))
	t3 := sendTo(a, second, 0) // takes t1's slot
	if t3%2 != t1%2 || t3 == t1 {
		t.Fatalf("tokens %d then %d: the slot was not reused with a new token", t1, t3)
	}
	a.received(ackFor(a, t1, `{"error":{"code":503,"description":"late"}}`))
	a.received(ackFor(a, t3+2, `{"error":{"code":503,"description":"unknown"}}`))
	a.received(ackFor(a, t2, `{"stream":"S","seq":2}`))
	a.sent(first)
	select {
	case <-first.done:
	default:
		t.Fatal("first call not done after both acks")
	}
	if first.errs[0] != nil || first.errs[1] != nil {
		t.Fatalf("first call's errors %v", first.errs)
	}
	if second.left != 2 {
		t.Fatalf("a late or unknown ack settled the second call's message: %d left", second.left)
	}
	a.received(ackFor(a, t3, `{"stream":"S","seq":3}`))
	t4 := sendTo(a, second, 1)
	boom := errors.New("boom")
	a.abandon(second, boom)
	if second.errs[0] != nil || !errors.Is(second.errs[1], boom) || len(a.free) != 2 || len(a.window) != 0 {
		t.Fatalf("after abandon: errs %v, %d free slots, window %d", second.errs, len(a.free), len(a.window))
	}
	a.received(ackFor(a, t4, `{"stream":"S","seq":4}`))
	if !errors.Is(second.errs[1], boom) {
		t.Fatal("an ack after abandon changed the outcome")
	}
}

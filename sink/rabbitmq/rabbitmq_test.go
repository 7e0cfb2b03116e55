package rabbitmq

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// newEvent returns an event of aggregate agg with a payload of n bytes.
func newEvent(id, agg string, n int) *event.Event {
	return &event.Event{ID: id, AggregateType: "order", AggregateID: agg, EventType: "created",
		ContentType: "application/json", Payload: []byte(strings.Repeat("x", n))}
}

// publish publishes batch with a 30 s bound and returns the classes of
// its events (sinktest.Classes).
func publish(t *testing.T, s *Sink, batch ...*event.Event) []string {
	t.Helper()
	err := s.Publish(ctxFor(t, 30*time.Second), batch)
	if err != nil {
		t.Log(err)
	}
	return sinktest.Classes(err, len(batch))
}

// TestClassification checks, against the node, how each failure the
// broker reports is classified: the destination's fault (unavailable)
// for a missing exchange (404 NOT_FOUND), an unroutable message (basic.return
// 312 NO_ROUTE), write access refused to an exchange (403 ACCESS_REFUSED),
// a refused password, a missing virtual host; a basic.nack (a queue at its
// length limit with overflow reject-publish) suspect and transient; the
// event's fault (permanent) for a body over the sink's max_message_bytes or
// a row header name over 255 bytes. In each batch the event that is fine
// is published.
func TestClassification(t *testing.T) {
	t.Parallel()
	node := broker(t)
	ad := newAdmin(t)
	ad.exchangeWithQueue("cls")
	ad.exchangeWithQueue("allowed-cls")
	if err := ad.do(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare("cls-unbound", "topic", true, false, false, false, nil); err != nil {
			return err
		}
		if err := ch.ExchangeDeclare("cls-full", "direct", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("cls-full", true, false, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
			return err
		}
		return ch.QueueBind("cls-full", "k", "cls-full", false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	url := guestURL(node.Addr())
	ok := newEvent("ok-1", "a1", 10)

	t.Run("exchange_not_found", func(t *testing.T) {
		s := newTestSink(t, url, Config{Exchange: "{aggregate_type}", RoutingKey: "k"}, Options{})
		missing := newEvent("nf-1", "a2", 10)
		missing.AggregateType = "cls-missing"
		good := *ok
		good.AggregateType = "cls"
		want(t, publish(t, s, missing, &good), "unavailable", "ok")
		if err := s.Probe(ctxFor(t, 10*time.Second), s.DestinationOf(missing)); fault.ClassOf(err) != fault.Unavailable {
			t.Errorf("Probe of the missing exchange: %v, want unavailable", err)
		}
	})
	t.Run("no_route", func(t *testing.T) {
		s := newTestSink(t, url, Config{Exchange: "{aggregate_type}", RoutingKey: "k"}, Options{})
		unroutable := newEvent("nr-1", "a2", 10)
		unroutable.AggregateType = "cls-unbound"
		good := *ok
		good.AggregateType = "cls"
		err := s.Publish(ctxFor(t, 30*time.Second), []*event.Event{unroutable, &good, unroutable})
		want(t, sinktest.Classes(err, 3), "unavailable", "ok", "unavailable")
		if e := sink.Failed(err, 0); e == nil || !strings.Contains(e.Error(), "312 NO_ROUTE") {
			t.Errorf("unroutable event: %v, want the return's 312 NO_ROUTE", e)
		}
	})
	t.Run("access_refused", func(t *testing.T) {
		lim := fmt.Sprintf("amqp://%s:%s@%s/", limitedUser, limitedPassword, node.Addr())
		s := newTestSink(t, lim, Config{Exchange: "{aggregate_type}", RoutingKey: "k"}, Options{})
		denied := newEvent("ar-1", "a2", 10)
		denied.AggregateType = "cls"
		want(t, publish(t, s, denied), "unavailable")
		allowed := newEvent("ar-2", "a3", 10)
		allowed.AggregateType = "allowed-cls"
		want(t, publish(t, s, allowed), "ok")
	})
	t.Run("bad_password", func(t *testing.T) {
		s := newTestSink(t, fmt.Sprintf("amqp://guest:wrong@%s/", node.Addr()), Config{Exchange: "cls", RoutingKey: "k"}, Options{})
		want(t, publish(t, s, ok), "unavailable")
		err := s.Check(ctxFor(t, 10*time.Second))
		if err == nil || strings.Contains(err.Error(), "wrong") || !CredentialsRefused(err) {
			t.Errorf("Check: %v, want refused credentials without the password", err)
		}
	})
	t.Run("no_vhost", func(t *testing.T) {
		s := newTestSink(t, guestURL(node.Addr())+"missing-vhost", Config{Exchange: "cls", RoutingKey: "k"}, Options{})
		want(t, publish(t, s, ok), "unavailable")
		if _, err := s.Declare(ctxFor(t, 10*time.Second)); !CredentialsRefused(err) {
			t.Errorf("Declare: %v, want refused access to the virtual host", err)
		}
		down := newTestSink(t, "amqp://guest:guest@127.0.0.1:1/", Config{Exchange: "cls", RoutingKey: "k"}, Options{})
		if _, err := down.Declare(ctxFor(t, 10*time.Second)); err == nil || CredentialsRefused(err) || fault.ClassOf(err) != fault.Unavailable {
			t.Errorf("Declare with the broker down: %v, want unavailable, not refused credentials", err)
		}
	})
	t.Run("nack", func(t *testing.T) {
		s := newTestSink(t, url, Config{Exchange: "cls-full", RoutingKey: "k"}, Options{})
		want(t, publish(t, s, newEvent("nk-1", "a1", 10)), "ok")
		want(t, publish(t, s, newEvent("nk-2", "a2", 10)), "suspect-transient")
	})
	t.Run("event_fault", func(t *testing.T) {
		s := newTestSink(t, url, Config{Exchange: "cls", RoutingKey: "k", MaxMessageBytes: 1000}, Options{})
		big := newEvent("ef-1", "a2", 1001)
		long := newEvent("ef-2", "a3", 10)
		long.Headers = map[string]string{strings.Repeat("h", 256): "v"}
		want(t, publish(t, s, big, ok, long), "permanent", "ok", "permanent")
	})
}

// want compares classes with the expected ones.
func want(t *testing.T, got []string, expected ...string) {
	t.Helper()
	if !slices.Equal(got, expected) {
		t.Errorf("classes %v, want %v", got, expected)
	}
}

// TestConfirmTimeout stalls the connection after a message was sent: the
// publish fails as unavailable when the confirm timeout passes, the sink
// drops the connection, and the next publish, over a new connection, is
// confirmed. The queue holds the event at most twice and the next event of
// its aggregate after every copy of it.
func TestConfirmTimeout(t *testing.T) {
	t.Parallel()
	ad := newAdmin(t)
	ad.exchangeWithQueue("stall")
	p, err := testenv.StartProxy(broker(t).Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := newTestSink(t, guestURL(p.Addr()), Config{Exchange: "stall", RoutingKey: "k"}, Options{ConfirmTimeout: 2 * time.Second})
	e1, e2 := newEvent("st-1", "a", 10), newEvent("st-2", "a", 10)
	if err := s.Probe(ctxFor(t, 20*time.Second), sink.Broker); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	err = s.Publish(context.Background(), []*event.Event{e1})
	if !strings.Contains(fmt.Sprint(err), errConfirmTimeout.Error()) || fault.ClassOf(sink.Failed(err, 0)) != fault.Unavailable {
		t.Fatalf("stalled publish: %v, want an unavailable confirm timeout", err)
	}
	p.Cut()
	p.Resume()
	want(t, publish(t, s, e1), "ok")
	want(t, publish(t, s, e2), "ok")
	var ids []string
	for _, d := range ad.drain("stall") {
		ids = append(ids, d.MessageId)
	}
	if n := len(ids); n < 2 || n > 3 || ids[n-1] != "st-2" || slices.Index(ids, "st-2") != n-1 {
		t.Errorf("queue holds %v, want st-1 once or twice, then st-2", ids)
	}
}

// TestDeclare checks relay init's declaration: a missing exchange and
// quorum queue are created and bound, and a second run, or one finding an
// exchange of another type, changes nothing.
func TestDeclare(t *testing.T) {
	t.Parallel()
	ad := newAdmin(t)
	url := guestURL(broker(t).Addr())
	s := newTestSink(t, url, Config{Exchange: "decl", RoutingKey: "{aggregate_type}", Declare: true}, Options{})
	if err := s.Check(ctxFor(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "relay init") {
		t.Errorf("Check before Declare: %v, want the missing exchange and how to create it", err)
	}
	for range 2 {
		msg, err := s.Declare(ctxFor(t, 20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Log(msg)
	}
	if err := s.Check(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("Check after Declare: %v", err)
	}
	want(t, publish(t, s, newEvent("dc-1", "a", 10)), "ok")
	if got := ad.drain("decl"); len(got) != 1 || got[0].MessageId != "dc-1" {
		t.Errorf("queue decl holds %d messages, want dc-1", len(got))
	}
	err := ad.do(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive("decl", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	if err != nil {
		t.Errorf("queue decl is not a durable quorum queue: %v", err)
	}
	// An existing fanout exchange stays as it is.
	if err := ad.do(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare("decl-fanout", "fanout", true, false, false, false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	s2 := newTestSink(t, url, Config{Exchange: "decl-fanout", RoutingKey: "k", Declare: true, Queue: "decl-fanout-q"}, Options{})
	if _, err := s2.Declare(ctxFor(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := ad.do(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive("decl-fanout", "fanout", true, false, false, false, nil)
	}); err != nil {
		t.Errorf("exchange decl-fanout changed: %v", err)
	}
}

package rabbitmq

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// TestOrderedRuns publishes one batch with several events of each of
// three aggregates to a direct exchange: a's second event has a routing
// key no queue is bound for (returned, 312 NO_ROUTE), c's second is nacked
// by a queue at its length limit, b's all arrive. The events after a
// failed one are not stored and fail as sink.ErrHeldBack. Then, as the
// pipeline does, a and c are published again from their failed event once
// their destinations are fixed: every event arrives once, first
// deliveries in each aggregate's order.
func TestOrderedRuns(t *testing.T) {
	t.Parallel()
	ad := newAdmin(t)
	if err := ad.do(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare("ord", "direct", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("ord", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare("ord-full", true, false, false, false, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
			return err
		}
		if err := ch.QueueBind("ord-full", "full", "ord", false, nil); err != nil {
			return err
		}
		return ch.QueueBind("ord", "ok", "ord", false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	s := newTestSink(t, guestURL(broker(t).Addr()), Config{Exchange: "ord", RoutingKey: "{event_type}"}, Options{})
	if s.MaxPerAggregate() < 4 {
		t.Fatalf("MaxPerAggregate %d, want at least 4", s.MaxPerAggregate())
	}
	ev := func(agg string, n int, key string) *event.Event {
		e := newEvent(fmt.Sprintf("%s-%d", agg, n), agg, 10)
		e.EventType = key
		return e
	}
	a := []*event.Event{ev("a", 1, "ok"), ev("a", 2, "unbound"), ev("a", 3, "ok"), ev("a", 4, "ok")}
	b := []*event.Event{ev("b", 1, "ok"), ev("b", 2, "ok"), ev("b", 3, "ok"), ev("b", 4, "ok")}
	c := []*event.Event{ev("c", 1, "full"), ev("c", 2, "full"), ev("c", 3, "ok")}
	batch := []*event.Event{a[0], a[1], a[2], a[3], b[0], b[1], b[2], c[0], b[3], c[1], c[2]}
	err := s.Publish(ctxFor(t, 60*time.Second), batch)
	t.Log(err)
	classes := map[string]string{}
	for i, e := range batch {
		f := sink.Failed(err, i)
		switch {
		case f == nil:
			classes[e.ID] = "ok"
		case errors.Is(f, sink.ErrHeldBack):
			classes[e.ID] = "held"
		default:
			classes[e.ID] = fault.ClassOf(f).String()
		}
	}
	wantClasses := map[string]string{"a-1": "ok", "a-2": "unavailable", "a-3": "held", "a-4": "held",
		"b-1": "ok", "b-2": "ok", "b-3": "ok", "b-4": "ok", "c-1": "ok", "c-2": "transient", "c-3": "held"}
	for id, w := range wantClasses {
		if classes[id] != w {
			t.Errorf("event %s: %s, want %s", id, classes[id], w)
		}
	}
	if got := ids(ad.drain("ord")); !slices.Equal(got, []string{"a-1", "b-1", "b-2", "b-3", "b-4"}) {
		t.Errorf("queue ord holds %v after the first call, want a-1 and b's events: nothing of a after its returned event", got)
	}
	if got := ids(ad.drain("ord-full")); !slices.Equal(got, []string{"c-1"}) {
		t.Errorf("queue ord-full holds %v, want c-1", got)
	}

	if err := ad.do(func(ch *amqp.Channel) error { return ch.QueueBind("ord", "unbound", "ord", false, nil) }); err != nil {
		t.Fatal(err)
	}
	want(t, publish(t, s, a[1], a[2], a[3], c[1], c[2]), "ok", "ok", "ok", "ok", "ok")
	if got := ids(ad.drain("ord")); !slices.Equal(got, []string{"a-2", "a-3", "a-4", "c-3"}) {
		t.Errorf("queue ord holds %v after the retry, want a-2, a-3, a-4, c-3", got)
	}
	if got := ids(ad.drain("ord-full")); !slices.Equal(got, []string{"c-2"}) {
		t.Errorf("queue ord-full holds %v after the retry, want c-2", got)
	}
}

// ids returns the message ids of ds, in their order, sorted stably by
// aggregate so that each aggregate's order shows.
func ids(ds []amqp.Delivery) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.MessageId)
	}
	slices.SortStableFunc(out, func(x, y string) int { return int(x[0]) - int(y[0]) })
	return out
}

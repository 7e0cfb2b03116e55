package rabbitmq

import (
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// TestConformance runs the shared sink conformance suite against a
// RabbitMQ node. Each scope publishes to a topic exchange of its name with
// the suite's template as routing key, and a classic queue of that name
// bound with "#" holds what arrives. Sinks reach the node through a
// Proxy, so that Stop and Start make it unreachable and reachable
// again without losing its messages. The node's max_message_size refuses
// the oversized event (406 PRECONDITION_FAILED).
func TestConformance(t *testing.T) {
	t.Parallel()
	ad := newAdmin(t)
	proxy := testenv.NewProxy(t, broker(t).Addr())
	var mu sync.Mutex
	received := map[string][]sinktest.Message{}

	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink {
			ad.exchangeWithQueue(scope)
			return newTestSink(t, guestURL(proxy.Addr()), Config{Exchange: scope, RoutingKey: tmpl}, Options{})
		},
		Received: func(t *testing.T, scope string) []sinktest.Message {
			mu.Lock()
			defer mu.Unlock()
			for _, d := range ad.drain(scope) {
				received[scope] = append(received[scope], toSinktest(t, d))
			}
			return received[scope]
		},
		Sanitize: sanitizeKey,
		Stop:     func(t *testing.T) { proxy.Down() },
		Start: func(t *testing.T) {
			if err := proxy.Up(); err != nil {
				t.Fatal(err)
			}
		},
		// The sink connects, then the proxy stops moving bytes: messages
		// are sent and never confirmed.
		NewStalled: func(t *testing.T, scope, tmpl string) sink.Sink {
			ad.exchangeWithQueue(scope)
			p, err := testenv.StartProxy(broker(t).Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			s := newTestSink(t, guestURL(p.Addr()), Config{Exchange: scope, RoutingKey: tmpl}, Options{ConfirmTimeout: time.Minute})
			if err := s.Probe(ctxFor(t, 20*time.Second), scope+"/x"); err != nil {
				t.Fatal(err)
			}
			p.Stall()
			return s
		},
		MaxMessageBytes: brokerMaxMessage,
		Inspect: func(t *testing.T, e *event.Event, m sinktest.Message) {
			d := m.Raw.(amqp.Delivery)
			if d.DeliveryMode != amqp.Persistent {
				t.Errorf("event %s: delivery mode %d, want persistent", e.ID, d.DeliveryMode)
			}
		},
		Features: sinktest.Features{
			IDHeaders:         []string{"MessageId"},
			ContentTypeHeader: "content_type",
			Control:           sink.RabbitMQRules,
		},
	})
}

package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// The RabbitMQ node the tests of this binary share, started on first use
// and shut down when the binary exits; each test has an exchange and queue
// of its own.
var (
	rabbitOnce sync.Once
	rabbitNode *testenv.RabbitMQ
	rabbitErr  error
	rabbitSeq  atomic.Int64
)

func rabbitBroker(t *testing.T) *testenv.RabbitMQ {
	t.Helper()
	startRabbitNode()
	if rabbitErr != nil {
		t.Fatal(rabbitErr)
	}
	return rabbitNode
}

// startRabbitNode starts the shared node once; TestMain's exit function
// stops it.
func startRabbitNode() {
	rabbitOnce.Do(func() {
		rabbitNode, rabbitErr = testenv.StartRabbitMQ(testenv.RabbitMQOptions{})
	})
}

// bootRabbitEarly starts the shared node in the background when the whole
// package runs, so that it boots while the serial tests run (a boot took
// over 90 s with both cores busy), and registers its shutdown, which
// waits for a boot still in progress.
func bootRabbitEarly() {
	booted := make(chan struct{})
	if flag.Lookup("test.run").Value.String() == "" {
		go func() { startRabbitNode(); close(booted) }()
	} else {
		close(booted)
	}
	testenv.OnExit(func() {
		<-booted // a boot a test started ended with its test
		if rabbitErr == nil && rabbitNode != nil {
			rabbitNode.Shutdown()
		}
	})
}

// startRabbitMQ declares an exchange and a classic queue bound to it with
// "#" on the shared node and returns the sink block publishing there and
// a collector of the queue.
func startRabbitMQ(t *testing.T) (string, func() []verify.Delivery) {
	node := rabbitBroker(t)
	return rabbitSink(t, node.Addr(), node.Addr())
}

// rabbitSink declares the test's exchange and queue through admin and
// returns the sink block of a relay reaching the node at addr, and the
// queue's collector. Each delivery's message_id property must equal its
// message_id header.
func rabbitSink(t *testing.T, admin, addr string) (string, func() []verify.Delivery) {
	name := fmt.Sprintf("relay-%d", rabbitSeq.Add(1))
	conn, err := amqp.Dial("amqp://guest:guest@" + admin + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(name, "#", name, false, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ds []verify.Delivery
	collect := func() []verify.Delivery {
		mu.Lock()
		defer mu.Unlock()
		for {
			m, ok, err := ch.Get(name, true)
			if err != nil {
				t.Errorf("get from %s: %v", name, err)
				break
			}
			if !ok {
				break
			}
			agg, _ := m.Headers["aggregate_id"].(string)
			d := payloadDelivery(m.MessageId, agg, m.Body)
			if h, _ := m.Headers["message_id"].(string); h != m.MessageId {
				d.Problem = fmt.Sprintf("message_id header %q differs from the property %q", h, m.MessageId)
			}
			ds = append(ds, d)
		}
		return append([]verify.Delivery(nil), ds...)
	}
	yaml := fmt.Sprintf("sink:\n  type: rabbitmq\n  rabbitmq:\n    url: amqp://guest:${RABBITMQ_PASSWORD:-guest}@%s/\n    exchange: %s\n", addr, name)
	return yaml, collect
}

// TestRabbitMQOutage cuts the relay off from RabbitMQ (a proxy that stops
// accepting and drops its connections) for 8 seconds while events flow:
// /readyz answers 503 during it, no event is dead-lettered, and once the
// broker is back the relay reconnects and drains by itself, delivering
// every event in order.
func TestRabbitMQOutage(t *testing.T) {
	t.Parallel()
	node := rabbitBroker(t)
	proxy := testenv.NewProxy(t, node.Addr())
	sinkYAML, collect := rabbitSink(t, node.Addr(), proxy.Addr())
	s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect})
	addr := s.withHTTP()
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 2000, 200, 2); close(produced) }()
	s.waitPublishing()
	proxy.Down()
	stopped := time.Now()
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	t.Logf("rabbitmq outage: /readyz 503 after %s", time.Since(stopped).Round(100*time.Millisecond))
	time.Sleep(time.Until(stopped.Add(8 * time.Second)))
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	<-produced
	s.finish(relay, addr)
}

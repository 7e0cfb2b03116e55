package rabbitmq

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// brokerMaxMessage is the test node's max_message_size: small enough to
// keep the oversize checks cheap.
const brokerMaxMessage = 256 << 10

// The test node's users besides guest: limited may publish only to
// exchanges whose names start with "allowed".
const (
	limitedUser     = "limited"
	limitedPassword = "limited-pw"
)

var (
	nodeOnce sync.Once
	node     *testenv.RabbitMQ
	nodeErr  error
)

// TestMain shuts down the node the package's tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	if node != nil {
		node.Shutdown()
	}
	os.Exit(code)
}

// broker returns the node the package's tests share, starting it on first
// use.
func broker(t *testing.T) *testenv.RabbitMQ {
	t.Helper()
	nodeOnce.Do(func() {
		node, nodeErr = testenv.StartRabbitMQ(testenv.RabbitMQOptions{
			Conf: fmt.Sprintf("max_message_size = %d", brokerMaxMessage),
			TLS:  true,
			Users: []testenv.RabbitMQUser{{Name: limitedUser, Password: limitedPassword,
				Configure: "^$", Write: "^allowed", Read: "^$"}},
		})
	})
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	return node
}

// guestURL returns the URL of guest at addr.
func guestURL(addr string) string { return "amqp://guest:guest@" + addr + "/" }

// newTestSink returns a sink on url with cfg, closed when t ends.
func newTestSink(t *testing.T, url string, cfg Config, opts Options) *Sink {
	t.Helper()
	cfg.URL = url
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// admin is a guest connection of the test's own to the node, for setting
// up exchanges and queues and reading messages.
type admin struct {
	t    *testing.T
	conn *amqp.Connection
}

func newAdmin(t *testing.T) *admin {
	t.Helper()
	c, err := amqp.Dial(guestURL(broker(t).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &admin{t: t, conn: c}
}

// do runs f on a channel of its own.
func (a *admin) do(f func(ch *amqp.Channel) error) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(ch)
}

// exchangeWithQueue declares a topic exchange and a classic queue of the
// same name bound to it with "#".
func (a *admin) exchangeWithQueue(name string) {
	a.t.Helper()
	err := a.do(func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(name, "#", name, false, nil)
	})
	if err != nil {
		a.t.Fatalf("declare %s: %v", name, err)
	}
}

// drain takes every message of queue, acknowledging them.
func (a *admin) drain(queue string) []amqp.Delivery {
	a.t.Helper()
	var out []amqp.Delivery
	err := a.do(func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			out = append(out, d)
		}
	})
	if err != nil {
		a.t.Fatalf("drain %s: %v", queue, err)
	}
	return out
}

// toSinktest converts a delivery: the table's string headers, and the
// message_id and content_type properties as the headers MessageId and
// content_type.
func toSinktest(t *testing.T, d amqp.Delivery) sinktest.Message {
	hdr := map[string][]string{}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			t.Errorf("header %s is a %T, want a long string", k, v)
			continue
		}
		hdr[k] = append(hdr[k], s)
	}
	hdr["MessageId"] = []string{d.MessageId}
	hdr["content_type"] = []string{d.ContentType}
	return sinktest.Message{Destination: d.RoutingKey, Headers: hdr, Payload: d.Body, Raw: d}
}

// ctxFor returns a context ending after d or with t.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

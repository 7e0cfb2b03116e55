package pubsub

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// project is the project of every test topic.
const project = "relay-test"

// confMaxMessage is the sink's message limit in the conformance run: small
// enough to keep the oversize check cheap.
const confMaxMessage = 256 << 10

// TestConformance runs the shared sink conformance suite against pstest,
// Google's in-process Pub/Sub fake, reached through a proxy that Stop and
// Start take down and bring back. Topics are created by the harness before
// each publish (the sink never creates topics).
func TestConformance(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPubSub(t)
	made := &sync.Map{}
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink {
			return &creating{Sink: newSink(t, ps.Addr(), tmpl, Options{MaxMessageBytes: confMaxMessage}), ps: ps, t: t, made: made}
		},
		Received: func(t *testing.T, scope string) []sinktest.Message {
			var out []sinktest.Message
			for _, m := range ps.Messages(project, scope) {
				h := make(map[string][]string, len(m.Attributes))
				for k, v := range m.Attributes {
					h[k] = []string{v}
				}
				out = append(out, sinktest.Message{Destination: topicID(m.Topic), Key: m.OrderingKey, Headers: h, Payload: m.Data, Raw: m})
			}
			return out
		},
		Sanitize: sanitize,
		Stop:     func(t *testing.T) { ps.Stop() },
		Start:    func(t *testing.T) { ps.Start(t) },
		NewStalled: func(t *testing.T, scope, tmpl string) sink.Sink {
			p, err := testenv.StartProxy(ps.Server.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			p.Stall()
			return &creating{Sink: newSink(t, p.Addr(), tmpl, Options{PublishTimeout: time.Minute}), ps: ps, t: t, made: made}
		},
		MaxMessageBytes: confMaxMessage,
		Features: sinktest.Features{
			KeyedByAggregate:  true,
			ContentTypeHeader: attrContentType,
			Control:           Rules,
		},
	})
}

// newSink returns a sink publishing to tmpl through the fake at addr.
func newSink(t testing.TB, addr, tmpl string, opts Options) *Sink {
	t.Helper()
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.ClientOptions = testenv.ClientOptions(addr)
	s, err := New(context.Background(), Config{ProjectID: project, Topic: tmpl}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// topicID returns the ID of a full topic name.
func topicID(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			return name[i+1:]
		}
	}
	return name
}

// creating creates the topics of each batch in the fake, directly (so also
// while the proxy is down), before publishing it; made holds the topic IDs
// created so far.
type creating struct {
	*Sink
	ps   *testenv.PubSub
	t    *testing.T
	made *sync.Map
}

func (c *creating) Publish(ctx context.Context, batch []*event.Event) error {
	for _, e := range batch {
		if id := c.DestinationOf(e); destname.PubSubTopic(id) == nil {
			if _, done := c.made.LoadOrStore(id, true); !done {
				c.ps.CreateTopic(c.t, project, id)
			}
		}
	}
	return c.Sink.Publish(ctx, batch)
}

package sqs

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// TestConformanceFIFO runs the shared sink conformance suite against FIFO
// queues of the emulator: ordered per aggregate, keyed by MessageGroupId,
// deduplicated by MessageDeduplicationId. Queues keep the default
// MaximumMessageSize of 1 MiB, so the oversized event is refused by the
// sink itself before it is sent.
func TestConformanceFIFO(t *testing.T) {
	t.Parallel()
	h := newHarness(t, ".fifo", nil)
	h.Harness.MaxMessageBytes = maxMessageBytes
	h.Harness.Features = sinktest.Features{
		DedupesByID:       true,
		KeyedByAggregate:  true,
		IDHeaders:         []string{"MessageDeduplicationId"},
		ContentTypeHeader: attrContentType,
		Control:           sink.SQSRules,
	}
	sinktest.Run(t, h.Harness)
}

// TestConformanceStandard runs the suite against standard queues, whose
// MaximumMessageSize of 256 KiB makes SQS refuse the oversized event in its
// batch (a failed entry with SenderFault).
func TestConformanceStandard(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", map[string]string{"MaximumMessageSize": "262144"})
	h.Harness.MaxMessageBytes = 256 << 10
	h.Harness.Features = sinktest.Features{
		Unordered:         true,
		ContentTypeHeader: attrContentType,
		Control:           sink.SQSRules,
	}
	sinktest.Run(t, h.Harness)
}

// harness connects the suite to an emulator. Sinks reach the emulator
// through a testenv.Proxy, so that Stop and Start make SQS unreachable and
// reachable again without losing its queues and messages; Received reads
// the emulator directly.
type harness struct {
	sinktest.Harness
	srv    *testenv.SQS
	client *awssqs.Client
	proxy  *testenv.Proxy
	suffix string            // ".fifo" or ""
	attrs  map[string]string // of every queue created

	mu       sync.Mutex
	created  map[string]bool
	received map[string][]sinktest.Message // by scope
}

func newHarness(t *testing.T, suffix string, attrs map[string]string) *harness {
	srv := startEmulator(t)
	h := &harness{
		srv:      srv,
		client:   newClient(srv.Endpoint()),
		proxy:    testenv.NewProxy(t, strings.TrimPrefix(srv.Endpoint(), "http://")),
		suffix:   suffix,
		attrs:    attrs,
		created:  map[string]bool{},
		received: map[string][]sinktest.Message{},
	}
	h.Harness = sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink {
			return h.newSink(t, "http://"+h.proxy.Addr(), tmpl)
		},
		Received: h.receive,
		// A receive whose answer a loaded machine loses leaves its ten
		// messages in flight for receiveVisibility; receiveAll waits for
		// them, and the suite must wait for receiveAll.
		DeliveryTimeout: 2 * time.Minute,
		Template:        func(scope, suffix string) string { return scope + "-" + suffix + h.suffix },
		Sanitize:        sanitize,
		Stop:            func(t *testing.T) { h.proxy.Down() },
		Start: func(t *testing.T) {
			if err := h.proxy.Up(); err != nil {
				t.Fatal(err)
			}
		},
		// A TCP proxy that stops moving bytes: requests are sent but never
		// answered; the sink's request timeout (30s) is far away.
		NewStalled: func(t *testing.T, scope, tmpl string) sink.Sink {
			p, err := testenv.StartProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			p.Stall()
			return h.newSink(t, "http://"+p.Addr(), tmpl)
		},
		Inspect: func(t *testing.T, e *event.Event, m sinktest.Message) {
			raw := m.Raw.(types.Message)
			if h.suffix == "" && raw.Attributes["MessageGroupId"] != "" {
				t.Errorf("event %s: MessageGroupId %q on a standard queue", e.ID, raw.Attributes["MessageGroupId"])
			}
			for _, k := range []string{traceparent, tracestate} {
				if v := e.Headers[k]; v != "" && aws.ToString(raw.MessageAttributes[k].StringValue) != v {
					t.Errorf("event %s: attribute %s = %q, want the row's %s as an attribute of its own", e.ID, k, aws.ToString(raw.MessageAttributes[k].StringValue), v)
				}
			}
		},
	}
	return h
}

// newSink returns a sink on endpoint that creates the queues of each batch
// before publishing it, as the suite expects of a broker whose destinations
// must exist.
func (h *harness) newSink(t *testing.T, endpoint, tmpl string) sink.Sink {
	s := newTestSink(t, endpoint, Config{Queue: tmpl}, Options{})
	return &creatingSink{Sink: s, h: h, t: t}
}

type creatingSink struct {
	*Sink
	h *harness
	t *testing.T
}

func (c *creatingSink) Publish(ctx context.Context, batch []*event.Event) error {
	for _, e := range batch {
		if name, err := c.queueName(e); err == nil {
			c.h.ensureQueue(c.t, name)
		}
	}
	return c.Sink.Publish(ctx, batch)
}

func (h *harness) ensureQueue(t *testing.T, name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.created[name] {
		createQueue(t, h.client, name, h.attrs)
		h.created[name] = true
	}
}

// receive drains the scope's queues into what the scope received so far
// and returns all of it.
func (h *harness) receive(t *testing.T, scope string) []sinktest.Message {
	h.mu.Lock()
	defer h.mu.Unlock()
	out, err := h.client.ListQueues(context.Background(), &awssqs.ListQueuesInput{QueueNamePrefix: aws.String(scope), MaxResults: aws.Int32(1000)})
	if err != nil {
		t.Fatalf("list queues of %s: %v", scope, err)
	}
	for _, url := range out.QueueUrls {
		name := url[strings.LastIndexByte(url, '/')+1:]
		for _, m := range receiveAll(t, h.client, url) {
			h.received[scope] = append(h.received[scope], toSinktest(t, name, m))
		}
	}
	return h.received[scope]
}

// toSinktest converts a received message: attributes become headers (the
// row headers of a "headers" attribute too), MessageDeduplicationId is
// reported as a header of that name, the body is decoded, and the key is
// the MessageGroupId, reported as the aggregate_id when it is the
// documented mapping of it (fifoID).
func toSinktest(t *testing.T, queue string, m types.Message) sinktest.Message {
	hdr := map[string][]string{}
	for k, v := range m.MessageAttributes {
		if k != attrHeaders {
			hdr[k] = append(hdr[k], attrValue(v))
		}
	}
	if _, ok := m.MessageAttributes[attrHeaders]; ok {
		for k, v := range rowHeaders(t, m) {
			if _, own := m.MessageAttributes[k]; !own {
				hdr[k] = append(hdr[k], v)
			}
		}
	}
	if id, ok := m.Attributes["MessageDeduplicationId"]; ok {
		hdr["MessageDeduplicationId"] = append(hdr["MessageDeduplicationId"], id)
	}
	// SQS rejects empty attribute values, so the sink leaves them out; the
	// contract value is then the empty string.
	for _, k := range []string{attrEventType, attrAggregateType, attrAggregateID} {
		if _, ok := hdr[k]; !ok {
			hdr[k] = []string{""}
		}
	}
	key := m.Attributes["MessageGroupId"]
	if agg := hdr[attrAggregateID][0]; key != "" && key == fifoID(agg) {
		key = agg
	}
	return sinktest.Message{
		Destination: queue,
		Key:         key,
		Headers:     hdr,
		Payload:     decodedBody(t, m),
		Raw:         m,
	}
}

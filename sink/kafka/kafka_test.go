package kafka

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// newCluster starts an in-process Kafka cluster of one broker that does
// not auto-create topics; it is closed when the test ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(4)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newSink(t *testing.T, brokers []string, topic string, opts Options) *Sink {
	t.Helper()
	return newSinkConfig(t, Config{Brokers: brokers, Topic: topic}, opts)
}

func newSinkConfig(t *testing.T, cfg Config, opts Options) *Sink {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet()
	}
	s, err := New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func testEvent(n int, aggregateType, aggregateID string) *event.Event {
	return &event.Event{
		ID:            fmt.Sprintf("00000000-0000-4000-8000-%012d", n),
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		EventType:     "created",
		Payload:       fmt.Appendf(nil, `{"n": %d}`, n),
		ContentType:   event.ContentTypeJSON,
	}
}

func testEvents(n, aggregates int) []*event.Event {
	batch := make([]*event.Event, n)
	for i := range batch {
		batch[i] = testEvent(i, "order", fmt.Sprint(i%aggregates))
	}
	return batch
}

// publishAll publishes batch, and publishes again, as the pipeline does,
// the events Publish held back (sink.ErrHeldBack), which it may do with
// any run of one aggregate's events, until it holds back none. It returns
// the error of the first call in which an event failed otherwise.
func publishAll(ctx context.Context, s *Sink, batch []*event.Event) error {
	for len(batch) > 0 {
		err := s.Publish(ctx, batch)
		var held []*event.Event
		for i, e := range batch {
			switch f := sink.Failed(err, i); {
			case f == nil:
			case errors.Is(f, sink.ErrHeldBack):
				held = append(held, e)
			default:
				return err
			}
		}
		batch = held
	}
	return nil
}

// readTopics returns every record of topics, each partition in offset
// order, partitions one after another.
func readTopics(t *testing.T, brokers []string, topics ...string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for _, topic := range topics {
		recs, err := kafkatest.Read(ctx, brokers, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Topic == topic { // a prefix match
				out = append(out, r.Raw)
			}
		}
	}
	return out
}

func header(r *kgo.Record, key string) (string, int) {
	v, n := "", 0
	for _, h := range r.Headers {
		if h.Key == key {
			v, n = string(h.Value), n+1
		}
	}
	return v, n
}

// checkAll fails unless every error in err, a Publish result for n events,
// is of class want.
func checkAll(t *testing.T, when string, err error, n int, want fault.Class) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: Publish succeeded", when)
	}
	for i := range n {
		if f := sink.Failed(err, i); f == nil || fault.ClassOf(f) != want {
			t.Fatalf("%s: event %d: %v (class %v), want %v", when, i, f, fault.ClassOf(f), want)
		}
	}
}

func TestPublishRecords(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "outbox.order"))
	s := newSink(t, c.ListenAddrs(), "outbox.{aggregate_type}", Options{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	batch := []*event.Event{
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1,  "b":[true]}`), ContentType: event.ContentTypeJSON,
			Headers: map[string]string{"trace_id": "t-1", "b": " spaced\t", "message_id": "spoofed", "Content-Type": "spoofed/x"},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f61", AggregateType: "bin v1/ü", AggregateID: "b 2",
			EventType: "blob", Payload: binary, ContentType: event.ContentTypeBinary, Headers: map[string]string{},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f62", AggregateType: "", AggregateID: "",
			EventType: "empty", Payload: []byte{}, ContentType: event.ContentTypeText,
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f63", AggregateType: "order", AggregateID: "o-1",
			EventType: "nil", Payload: nil, ContentType: event.ContentTypeText,
		},
	}
	if err := publishAll(context.Background(), s, batch); err != nil {
		t.Fatal(err)
	}

	binTopic, emptyTopic := "outbox.bin_v1__"+template.Hash("bin v1/ü"), "outbox."+template.Hash("")
	topics := []string{"outbox.order", binTopic, emptyTopic, "outbox.order"}
	byID := map[string]*kgo.Record{}
	for _, r := range readTopics(t, c.ListenAddrs(), "outbox.order", binTopic, emptyTopic) {
		id, _ := header(r, "message_id")
		byID[id] = r
	}
	if len(byID) != len(batch) {
		t.Fatalf("read %d records, want %d", len(byID), len(batch))
	}
	for i, e := range batch {
		r := byID[e.ID]
		if r == nil {
			t.Fatalf("event %d not found", i)
		}
		if r.Topic != topics[i] {
			t.Errorf("event %d: topic %q, want %q", i, r.Topic, topics[i])
		}
		if string(r.Key) != e.AggregateID || r.Key == nil {
			t.Errorf("event %d: key %q (nil %v), want %q", i, r.Key, r.Key == nil, e.AggregateID)
		}
		if !bytes.Equal(r.Value, e.Payload) || r.Value == nil {
			t.Errorf("event %d: value %q, want %q", i, r.Value, e.Payload)
		}
		var got []string
		for _, h := range r.Headers {
			got = append(got, h.Key+"="+string(h.Value))
		}
		var want []string
		if i == 0 {
			want = []string{"b= spaced\t", "trace_id=t-1"}
		}
		want = append(want, "message_id="+e.ID, "event_type="+e.EventType, "aggregate_type="+e.AggregateType,
			"aggregate_id="+e.AggregateID, "content-type="+e.ContentType)
		if !slices.Equal(got, want) {
			t.Errorf("event %d: headers %q, want %q", i, got, want)
		}
	}
	// Events of one aggregate share a partition, in publish order.
	if a, b := byID[batch[0].ID], byID[batch[3].ID]; a.Partition != b.Partition || a.Offset >= b.Offset {
		t.Errorf("events of aggregate o-1 at %d/%d and %d/%d", a.Partition, a.Offset, b.Partition, b.Offset)
	}
}

// TestPartitionerMatchesJava checks that keys are spread by murmur2 like
// the Java client's default partitioner, so that other producers of the
// same topics put an aggregate in the same partition.
func TestPartitionerMatchesJava(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(8, "p"))
	s := newSink(t, c.ListenAddrs(), "p", Options{})
	var batch []*event.Event
	for i := range 64 {
		batch = append(batch, testEvent(i, "x", fmt.Sprintf("agg-%d", i)))
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	java := kgo.StickyKeyPartitioner(nil).ForTopic("p") // murmur2, as Java's DefaultPartitioner
	for _, r := range readTopics(t, c.ListenAddrs(), "p") {
		if want := int32(java.Partition(r, 8)); r.Partition != want {
			t.Errorf("key %s in partition %d, murmur2 says %d", r.Key, r.Partition, want)
		}
	}
}

func TestTopicOf(t *testing.T) {
	s := &Sink{}
	for _, c := range []struct {
		tmpl, aggType, want string
	}{
		{"outbox.{aggregate_type}", "Order-1.v2_x", "outbox.Order-1.v2_x"},
		{"outbox.{aggregate_type}", "a/b c:ü\x00", "outbox.a_b_c___" + template.Hash("a/b c:ü\x00")},
		{"outbox.{aggregate_type}", "a/b c:ü\x01", "outbox.a_b_c___" + template.Hash("a/b c:ü\x01")},
		{"outbox.{aggregate_type}", "", "outbox." + template.Hash("")},
		{"{aggregate_type}", ".", "_" + template.Hash(".")},
		{"{aggregate_type}", "..", "__" + template.Hash("..")},
		{"{aggregate_type}", "...", "..."},
		{"t-{aggregate_type}", strings.Repeat("x", 247), "t-" + strings.Repeat("x", 247)},
		{"t-{aggregate_type}", strings.Repeat("x", 300), "t-" + strings.Repeat("x", 238) + template.Hash(strings.Repeat("x", 300))},
		{"fixed", "anything", "fixed"},
	} {
		tmpl, err := template.Parse(c.tmpl, sanitize)
		if err != nil {
			t.Fatal(err)
		}
		s.topic = tmpl.Limit(destname.MaxKafkaTopic)
		if got := s.topicOf(&event.Event{AggregateType: c.aggType, EventType: "e", AggregateID: "1"}); got != c.want {
			t.Errorf("%q with %q: %q, want %q", c.tmpl, c.aggType, got, c.want)
		}
	}
}

func TestNewBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Topic: "t"}, "sink.kafka.brokers"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: "outbox.{nope}"}, "sink.kafka.topic"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: "out box.{aggregate_type}"}, "sink.kafka.topic"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: ".."}, "sink.kafka.topic"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", TLS: TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}}, "sink.kafka.tls.ca_file"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", TLS: TLS{Enabled: true, CertFile: "/nonexistent/c.pem", KeyFile: "/nonexistent/c.key"}}, "sink.kafka.tls.cert_file"},
		{Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", SASL: SASL{Mechanism: "GSSAPI"}}, "sink.kafka.sasl.mechanism"},
	} {
		_, err := New(context.Background(), c.cfg, Options{Logger: quiet()})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}

// closedAddr returns an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestNewUnreachable(t *testing.T) {
	start := time.Now()
	_, err := New(context.Background(), Config{Brokers: []string{closedAddr(t)}, Topic: "t",
		SASL: SASL{Mechanism: "PLAIN", Username: "u", Password: "s3cret"}}, Options{Logger: quiet()})
	if err == nil {
		t.Fatal("New reached a closed port")
	}
	t.Log(err)
	if fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("class %v, want unavailable", fault.ClassOf(err))
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error leaks the password: %v", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("New took %v", d)
	}
}

// TestProduceRequests checks what goes over the wire: acks=all, an
// idempotent producer ID, and the client ID.
func TestProduceRequests(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	var acks atomic.Int32
	var pid atomic.Int64
	acks.Store(99)
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		acks.Store(int32(pr.Acks))
		for _, tp := range pr.Topics {
			for _, p := range tp.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(p.Records); err == nil {
					pid.Store(b.ProducerID)
				}
			}
		}
		return nil, nil, false
	})
	var clientID atomic.Value
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if id := req.(*kmsg.InitProducerIDRequest); id.TransactionalID == nil {
			clientID.Store("init")
		}
		return nil, nil, false
	})
	s := newSinkConfig(t, Config{Brokers: c.ListenAddrs(), Topic: "t", ClientID: "orders-relay"}, Options{})
	if err := s.Publish(context.Background(), testEvents(10, 10)); err != nil {
		t.Fatal(err)
	}
	if acks.Load() != -1 {
		t.Errorf("produce acks %d, want -1 (all in-sync replicas)", acks.Load())
	}
	if pid.Load() < 0 {
		t.Errorf("producer ID %d: not idempotent", pid.Load())
	}
	if clientID.Load() == nil {
		t.Error("no InitProducerID request: not idempotent")
	}
	// Acknowledged means readable at once.
	if n := len(readTopics(t, c.ListenAddrs(), "t")); n != 10 {
		t.Errorf("read %d records right after Publish returned, want 10", n)
	}
}

// TestPublishManyAggregates publishes rounds of one event per aggregate from
// several goroutines, through a client buffer much smaller than a batch,
// and checks that each aggregate's events are stored in order.
func TestPublishManyAggregates(t *testing.T) {
	const workers, aggregates, rounds = 4, 250, 10
	c := newCluster(t, kfake.SeedTopics(8, "outbox.order"))
	s := newSink(t, c.ListenAddrs(), "outbox.{aggregate_type}", Options{MaxBufferedRecords: 64})

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				batch := make([]*event.Event, aggregates)
				for a := range batch {
					n := (w*rounds+r)*aggregates + a
					batch[a] = testEvent(n, "order", fmt.Sprintf("w%d-a%d", w, a))
					batch[a].Payload = fmt.Append(nil, r)
				}
				if err := s.Publish(context.Background(), batch); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	recs := readTopics(t, c.ListenAddrs(), "outbox.order")
	if len(recs) != workers*aggregates*rounds {
		t.Fatalf("topic holds %d records, want %d", len(recs), workers*aggregates*rounds)
	}
	next := map[string]int{}
	partition := map[string]int32{}
	for _, r := range recs {
		k := string(r.Key)
		if p, ok := partition[k]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		partition[k] = r.Partition
		if got := string(r.Value); got != fmt.Sprint(next[k]) {
			t.Fatalf("%s: round %s stored when round %d was due", k, got, next[k])
		}
		next[k]++
	}
}

// withTopicLimit creates topic with max.message.bytes limit.
func withTopicLimit(t *testing.T, c *kfake.Cluster, topic string, partitions int32, limit int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	v := fmt.Sprint(limit)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), partitions, 1, map[string]*string{"max.message.bytes": &v}, topic); err != nil {
		t.Fatal(err)
	}
}

func TestPublishOversizedIsPermanent(t *testing.T) {
	c := newCluster(t)
	withTopicLimit(t, c, "big", 1, 16*1024)
	s := newSink(t, c.ListenAddrs(), "big", Options{})
	batch := testEvents(30, 30)
	batch[10].Payload = bytes.Repeat([]byte("x"), 20*1024)

	err := s.Publish(context.Background(), batch)
	got := sinktest.Classes(err, len(batch))
	want := slices.Repeat([]string{"ok"}, len(batch))
	want[10] = "permanent"
	if !slices.Equal(got, want) {
		t.Fatalf("classes %v, want %v (err %v)", got, want, err)
	}
	msg := sink.Failed(err, 10).Error()
	if !strings.Contains(msg, batch[10].ID) || !strings.Contains(msg, "big") || !strings.Contains(msg, "MESSAGE_TOO_LARGE") {
		t.Errorf("error %q does not name the event, topic and cause", msg)
	}
	if n := len(readTopics(t, c.ListenAddrs(), "big")); n != 29 {
		t.Errorf("topic holds %d records, want 29", n)
	}
}

// TestPublishOversizedUnknownLimit hides the topic's max.message.bytes, so
// that the broker, not the client, rejects the batch with the oversized
// event: the event is permanent, the small events that shared its batch are
// transient and succeed when retried.
func TestPublishOversizedUnknownLimit(t *testing.T) {
	c := newCluster(t)
	withTopicLimit(t, c, "big", 1, 16*1024)
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Err: kerr.ClusterAuthorizationFailed, Count: -1})
	s := newSink(t, c.ListenAddrs(), "big", Options{Linger: 50 * time.Millisecond})
	batch := testEvents(30, 30)
	batch[10].Payload = make([]byte, 20*1024) // random, so compression cannot shrink it
	rand.Read(batch[10].Payload)

	err := s.Publish(context.Background(), batch)
	got := sinktest.Classes(err, len(batch))
	t.Logf("classes %v", got)
	if got[10] != "permanent" {
		t.Fatalf("oversized event: %v, want permanent", sink.Failed(err, 10))
	}
	var retry []*event.Event
	for i, class := range got {
		switch class {
		case "permanent":
			if i != 10 {
				t.Errorf("event %d: %v, want transient or ok", i, sink.Failed(err, i))
			}
		case "transient":
			retry = append(retry, batch[i])
		case "unavailable":
			t.Errorf("event %d: %v", i, sink.Failed(err, i))
		}
	}
	if len(retry) > 0 {
		if err := s.Publish(context.Background(), retry); err != nil {
			t.Fatalf("retry of %d events: %v", len(retry), err)
		}
	}
	if n := len(readTopics(t, c.ListenAddrs(), "big")); n != 29 {
		t.Errorf("topic holds %d records, want 29", n)
	}
}

func TestPublishUnreachable(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	if err := s.Publish(context.Background(), testEvents(5, 5)); err != nil {
		t.Fatal(err)
	}
	c.Close()

	for _, name := range []string{"known topic", "new topic"} {
		batch := testEvents(20, 7)
		if name == "new topic" {
			s.topic, _ = template.Parse("other.{aggregate_type}", sanitize)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		err := s.Publish(ctx, batch)
		cancel()
		d := time.Since(start)
		t.Logf("%s: %v after %v", name, sink.Failed(err, 0), d)
		checkAll(t, name, err, len(batch), fault.Unavailable)
		if d > 2*time.Second {
			t.Errorf("%s: Publish took %v with a 1s context", name, d)
		}
	}
}

// TestPublishAckTimeout stalls every produce request: Publish gives up after
// AckTimeout with unavailable errors.
func TestPublishAckTimeout(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{AckTimeout: 500 * time.Millisecond})
	stall(c)
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(4, 4))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Publish took %v with a 500ms ack timeout", d)
	}
	checkAll(t, "ack timeout", err, 4, fault.Unavailable)
	if !errors.Is(sink.Failed(err, 0), context.DeadlineExceeded) {
		t.Errorf("err %v, want a deadline", sink.Failed(err, 0))
	}
}

// stall makes c read produce requests and never answer them.
func stall(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true
	})
}

func TestPublishCancel(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{AckTimeout: time.Minute})
	stall(c)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := s.Publish(ctx, testEvents(10, 10))
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after the cancel", d-200*time.Millisecond)
	}
	checkAll(t, "after cancel", err, 10, fault.Unavailable)
	if !errors.Is(sink.Failed(err, 0), context.Canceled) {
		t.Errorf("err %v, want context.Canceled", sink.Failed(err, 0))
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	err = s.Publish(ctx, testEvents(3, 3))
	checkAll(t, "cancelled before", err, 3, fault.Unavailable)
}

func TestCloseFailsPendingPublish(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{AckTimeout: time.Minute})
	stall(c)
	time.AfterFunc(200*time.Millisecond, func() { s.Close() })
	start := time.Now()
	err := s.Publish(context.Background(), testEvents(3, 3))
	// Far below the minute it would wait, with room for -race on a loaded machine.
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("Publish returned %v after Close", d-200*time.Millisecond)
	}
	checkAll(t, "after Close", err, 3, fault.Unavailable)
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestClassify(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, c := range []struct {
		err  error
		want fault.Class
	}{
		{kerr.MessageTooLarge, fault.Permanent},
		{fmt.Errorf("%w (uncompressed_bytes=5)", kerr.MessageTooLarge), fault.Permanent},
		{kerr.RecordListTooLarge, fault.Permanent},
		{kerr.InvalidTopicException, fault.Permanent},
		{kerr.InvalidRecord, fault.Permanent},
		{kerr.TopicAuthorizationFailed, fault.Unavailable},
		{kerr.NotEnoughReplicas, fault.Unavailable},
		{kerr.NotLeaderForPartition, fault.Unavailable},
		{kerr.LeaderNotAvailable, fault.Unavailable},
		{kerr.RequestTimedOut, fault.Unavailable},
		{kerr.ClusterAuthorizationFailed, fault.Unavailable},
		{kerr.SaslAuthenticationFailed, fault.Unavailable},
		{dial, fault.Unavailable},
		{context.DeadlineExceeded, fault.Unavailable},
		{context.Canceled, fault.Unavailable},
		{kgo.ErrClientClosed, fault.Unavailable},
		{errClosed, fault.Unavailable},
		{kerr.UnknownTopicOrPartition, fault.Unavailable},
		{kerr.CorruptMessage, fault.Transient},
		{kerr.UnknownServerError, fault.Transient},
		{errors.New("something"), fault.Transient},
		{fault.AsUnavailable(fmt.Errorf("x: %w", kerr.TopicAuthorizationFailed)), fault.Unavailable},
		{fmt.Errorf("publish: %w", fault.AsPermanent(context.DeadlineExceeded)), fault.Permanent},
	} {
		if got := fault.ClassOf(classify(c.err)); got != c.want {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	// A batch rejected as too large fails its small events transiently.
	small := testEvent(1, "a", "1")
	big := testEvent(2, "a", "2")
	big.Payload = make([]byte, 20000)
	rejected := fmt.Errorf("%w (uncompressed_bytes=21000, compressed_bytes=900)", kerr.MessageTooLarge)
	if got := fault.ClassOf(classifyRecord(rejected, small)); got != fault.Transient {
		t.Errorf("small event of a rejected batch: %v, want transient", got)
	}
	if got := fault.ClassOf(classifyRecord(rejected, big)); got != fault.Permanent {
		t.Errorf("big event of a rejected batch: %v, want permanent", got)
	}
}

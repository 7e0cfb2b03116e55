package kafka

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
)

// sliceSource is a capture.Source that hands out events in batches and
// records what each batch's Complete settled.
type sliceSource struct {
	mu        sync.Mutex
	batches   [][]*event.Event
	published atomic.Int64
	dead      []capture.DeadEvent
}

func (s *sliceSource) Next(ctx context.Context) (capture.Batch, error) {
	s.mu.Lock()
	if len(s.batches) > 0 {
		b := &sliceBatch{src: s, evs: s.batches[0]}
		s.batches = s.batches[1:]
		s.mu.Unlock()
		return b, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s *sliceSource) Close() error { return nil }

type sliceBatch struct {
	src *sliceSource
	evs []*event.Event
}

func (b *sliceBatch) Events() []*event.Event  { return b.evs }
func (b *sliceBatch) Abandon(context.Context) {}
func (b *sliceBatch) Complete(_ context.Context, o capture.Outcome) error {
	b.src.mu.Lock()
	b.src.dead = append(b.src.dead, o.Dead...)
	b.src.mu.Unlock()
	b.src.published.Add(int64(len(o.Published)))
	return nil
}

// hotSource returns a source of n events of one aggregate in batches of
// 500, as poll capture hands them over.
func hotSource(n int) *sliceSource {
	src := &sliceSource{}
	for i := 0; i < n; i += 500 {
		var b []*event.Event
		for j := i; j < min(i+500, n); j++ {
			e := testEvent(j, "order", "hot")
			e.Position = uint64(j + 1)
			b = append(b, e)
		}
		src.batches = append(src.batches, b)
	}
	return src
}

// runPipeline publishes src through s until want events are published or
// dead, and returns how long it took.
func runPipeline(t *testing.T, src *sliceSource, s *Sink, want int) time.Duration {
	t.Helper()
	p := pipeline.New(src, s, pipeline.Options{
		Logger: quiet(),
		Retry:  pipeline.Retry{Initial: time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 5},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	deadline := time.After(60 * time.Second)
	for {
		src.mu.Lock()
		settled := int(src.published.Load()) + len(src.dead)
		src.mu.Unlock()
		if settled >= want {
			break
		}
		select {
		case <-deadline:
			cancel()
			t.Fatalf("%d of %d events settled after 60s", settled, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
	d := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return d
}

// TestHotAggregateThroughput publishes 20,000 events of one aggregate
// through the pipeline into kfake: they are stored once each, in order,
// at well over one broker round trip per event.
func TestHotAggregateThroughput(t *testing.T) {
	const n = 20000
	c := newCluster(t, kfake.SeedTopics(4, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	src := hotSource(n)
	d := runPipeline(t, src, s, n)
	t.Logf("%d events of one aggregate in %v: %.0f events/s", n, d.Round(time.Millisecond), n/d.Seconds())
	checkStoredOnceInOrder(t, c.ListenAddrs(), "t", n)
}

// checkStoredOnceInOrder fails t unless topic holds events 0..n-1 of the
// aggregate hot once each, in order.
func checkStoredOnceInOrder(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	recs := readTopics(t, brokers, topic)
	var got []string
	for _, r := range recs {
		id, _ := header(r, "message_id")
		got = append(got, id)
	}
	want := make([]string, n)
	for i := range want {
		want[i] = testEvent(i, "order", "hot").ID
	}
	if !slices.Equal(got, want) {
		t.Fatalf("topic holds %d records, want %d in order; first difference at %d", len(got), n, firstDiff(got, want))
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// failProduce makes c answer the nth produce request (1-based) with code
// for every partition in it, without storing anything.
func failProduce(c *kfake.Cluster, nth int32, code int16) {
	var seen atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if seen.Add(1) != nth {
			return nil, nil, false
		}
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			t := kmsg.NewProduceResponseTopic()
			t.Topic, t.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				p := kmsg.NewProduceResponseTopicPartition()
				p.Partition, p.ErrorCode, p.BaseOffset = rp.Partition, code, -1
				t.Partitions = append(t.Partitions, p)
			}
			resp.Topics = append(resp.Topics, t)
		}
		return resp, nil, true
	})
}

// TestHotAggregateFailureMidWindow rejects, as an invalid record, the third
// produce request of a stream of one aggregate's events, while later
// requests of the same partition are in flight (the topic's 16 KiB batch
// limit splits each publish into many requests): the first event of the
// rejected request is dead-lettered, every other event is stored, and the
// first deliveries are in order.
func TestHotAggregateFailureMidWindow(t *testing.T) {
	const n = 3000
	c := newCluster(t)
	withTopicLimit(t, c, "t", 1, 16*1024)
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	failProduce(c, 3, kerr.InvalidRecord.Code)
	src := hotSource(n)
	runPipeline(t, src, s, n)

	if len(src.dead) != 1 {
		ids := deadIDs(src.dead)
		t.Fatalf("%d dead letters, want 1: %v", len(ids), ids[:min(len(ids), 5)])
	}
	dead := src.dead[0].Event.ID
	var want []string
	for i := range n {
		if id := testEvent(i, "order", "hot").ID; id != dead {
			want = append(want, id)
		}
	}
	var first []string
	seen := map[string]bool{}
	for _, r := range readTopics(t, c.ListenAddrs(), "t") {
		id, _ := header(r, "message_id")
		if !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	if !slices.Equal(first, want) {
		t.Fatalf("%d first deliveries, want %d in order; first difference at %d", len(first), len(want), firstDiff(first, want))
	}
	t.Logf("dead letter %s (%s)", dead, src.dead[0].Err)
}

func deadIDs(ds []capture.DeadEvent) []string {
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.Event.ID)
	}
	return ids
}

// TestOversizedGoesAlone publishes ten events of one aggregate with the
// sixth over the topic's limit, which the client fails on its own: the
// sixth and the ones after it are held back, so none of them is stored
// ahead of it; published alone, it fails as permanent.
func TestOversizedGoesAlone(t *testing.T) {
	c := newCluster(t)
	withTopicLimit(t, c, "big", 1, 16*1024)
	s := newSink(t, c.ListenAddrs(), "big", Options{})
	batch := make([]*event.Event, 10)
	for i := range batch {
		batch[i] = testEvent(i, "order", "hot")
	}
	batch[5].Payload = bytes.Repeat([]byte("x"), 20*1024)

	err := s.Publish(context.Background(), batch)
	for i := range batch {
		f := sink.Failed(err, i)
		if (i < 5) != (f == nil) || i >= 5 && !errors.Is(f, sink.ErrHeldBack) {
			t.Errorf("event %d: %v", i, f)
		}
	}
	if n := len(readTopics(t, c.ListenAddrs(), "big")); n != 5 {
		t.Errorf("topic holds %d records, want the 5 before the oversized event", n)
	}
	err = s.Publish(context.Background(), batch[5:])
	if f := sink.Failed(err, 0); fault.ClassOf(f) != fault.Permanent {
		t.Errorf("oversized event alone: %v, want permanent", f)
	}
}

package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
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
	"github.com/outboxrelay/relay/sink/sinktest"
)

// hotEvents returns n events of the aggregate hot.
func hotEvents(n int) []*event.Event {
	evs := make([]*event.Event, n)
	for i := range evs {
		evs[i] = testEvent(i, "order", "hot")
		evs[i].Position = uint64(i + 1)
	}
	return evs
}

// hotOptions are the pipeline options of the hot aggregate tests.
func hotOptions() pipeline.Options {
	return pipeline.Options{
		Logger: quiet(),
		Retry:  pipeline.Retry{Initial: time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 5},
	}
}

// TestHotAggregateThroughput publishes 20,000 events of one aggregate
// through the pipeline into kfake: they are stored once each, in order,
// at well over one broker round trip per event.
func TestHotAggregateThroughput(t *testing.T) {
	const n = 20000
	c := newCluster(t, kfake.SeedTopics(4, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	_, d := sinktest.Drive(t, s, hotEvents(n), hotOptions())
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
	failProduces(c, code, func(n int32) bool { return n == nth })
}

// failProduces makes c answer the nth produce request (1-based) with code
// for every partition in it, without storing anything, when fail(n).
func failProduces(c *kfake.Cluster, code int16, fail func(n int32) bool) {
	var seen atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !fail(seen.Add(1)) {
			return nil, nil, false
		}
		return failedProduce(req.(*kmsg.ProduceRequest), code), nil, true
	})
}

// failedProduce answers pr with code for every partition in it.
func failedProduce(pr *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
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
	return resp
}

// TestHotAggregateFailureMidWindow rejects the third produce request of a
// stream of one aggregate's events through a topic with a 16 KiB batch
// limit, once as an invalid record and once as a corrupt message: no event
// is dead-lettered (the first event of the request rejected as invalid is
// published again alone and stored; a corrupt message is retried), every
// event is stored, and the first deliveries are in order. Before each
// publish carried at most one batch of the aggregate, the pipeline's calls
// of 500 events took several requests, and records the call produced after
// the rejection, before franz-go's promise reported it, were stored ahead of
// the rejected ones (about one run in 200 with -race under load).
func TestHotAggregateFailureMidWindow(t *testing.T) {
	for _, tc := range []struct {
		err  *kerr.Error
		dead int
	}{{kerr.InvalidRecord, 0}, {kerr.CorruptMessage, 0}} {
		t.Run(tc.err.Message, func(t *testing.T) {
			const n = 3000
			c := newCluster(t)
			withTopicLimit(t, c, "t", 1, 16*1024)
			s := newSink(t, c.ListenAddrs(), "t", Options{})
			failProduce(c, 3, tc.err.Code)
			deadLetters, _ := sinktest.Drive(t, s, hotEvents(n), hotOptions())

			if ids := deadIDs(deadLetters); len(ids) != tc.dead {
				t.Fatalf("%d dead letters, want %d: %v", len(ids), tc.dead, ids[:min(len(ids), 5)])
			}
			var want []string
			for i := range n {
				if id := testEvent(i, "order", "hot").ID; !slices.Contains(deadIDs(deadLetters), id) {
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
		})
	}
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

// TestNoRecordAfterFailedBatch publishes 5,000 events of one aggregate the
// way the pipeline does, each call with the events from the first one not
// yet published, while kfake rejects the second produce request as a
// corrupt message: once an event fails other than held back, the topic
// holds exactly the events before it, and Publish reports every event of
// the call from it on as failed. Before the sink stopped producing an
// aggregate after a failure, the records produced after the client had
// failed the partition's batches started a new sequence and were stored
// ahead of the failed ones; before it held back what does not fit in one
// batch, one call took several requests and the rejection came back while
// it still produced.
func TestNoRecordAfterFailedBatch(t *testing.T) {
	const n = 5000
	c := newCluster(t)
	withTopicLimit(t, c, "t", 1, 16*1024)
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	failProduce(c, 2, kerr.CorruptMessage.Code)
	batch := hotEvents(n)
	first := 0 // events published
	for {
		if first == n {
			t.Fatal("no event failed")
		}
		rest := batch[first:]
		err := s.Publish(context.Background(), rest)
		ok := 0
		for ok < len(rest) && sink.Failed(err, ok) == nil {
			ok++
		}
		for i := ok; i < len(rest); i++ {
			if sink.Failed(err, i) == nil {
				t.Fatalf("event %d reported published after event %d failed", first+i, first+ok)
			}
		}
		first += ok
		if ok < len(rest) && !errors.Is(sink.Failed(err, ok), sink.ErrHeldBack) {
			break
		}
	}
	var got []string
	for _, r := range readTopics(t, c.ListenAddrs(), "t") {
		id, _ := header(r, "message_id")
		got = append(got, id)
	}
	var want []string
	for _, e := range batch[:first] {
		want = append(want, e.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the topic holds %d records, want the %d before the first failed event; first difference at %d", len(got), first, firstDiff(got, want))
	}
}

// TestRejectedBatchesKeepOrder streams 6,000 events of 20 aggregates
// through the pipeline into a topic of one partition with a 16 KiB batch
// limit while kfake rejects every fourth produce request as a corrupt
// message, in three rounds: every event is stored, and the first
// deliveries of each aggregate are in order. A run of one aggregate's
// events in a call could be split between two record batches (other
// records filled part of the first, or it was sent while the run was
// produced); when the broker rejected the first, the rest of the run,
// produced before the failure was reported, went into a new batch under a
// new producer epoch and was stored ahead of it (most rounds with -race,
// before the partitioner kept each run in one batch).
func TestRejectedBatchesKeepOrder(t *testing.T) {
	const n, aggs = 6000, 20
	evs := make([]*event.Event, n)
	for i := range evs {
		evs[i] = testEvent(i, "order", fmt.Sprint("hot-", i%aggs))
		evs[i].Position = uint64(i + 1)
	}
	opts := hotOptions()
	opts.Retry.MaxAttempts = 1000 // a rejection is no fault of the event
	for round := range 3 {
		c := newCluster(t)
		withTopicLimit(t, c, "t", 1, 16*1024)
		s := newSink(t, c.ListenAddrs(), "t", Options{})
		failProduces(c, kerr.CorruptMessage.Code, func(n int32) bool { return n%4 == 0 })
		if dead, _ := sinktest.Drive(t, s, evs, opts); len(dead) > 0 {
			t.Fatalf("round %d: %d dead letters, want 0: %v", round, len(dead), deadIDs(dead)[0])
		}
		first := map[string][]string{} // aggregate -> ids of its first deliveries
		seen := map[string]bool{}
		for _, r := range readTopics(t, c.ListenAddrs(), "t") {
			id, _ := header(r, "message_id")
			agg, _ := header(r, "aggregate_id")
			if !seen[id] {
				seen[id] = true
				first[agg] = append(first[agg], id)
			}
		}
		for a := range aggs {
			var want []string
			for i := a; i < n; i += aggs {
				want = append(want, evs[i].ID)
			}
			if got := first[evs[a].AggregateID]; !slices.Equal(got, want) {
				t.Errorf("round %d, aggregate %s: %d first deliveries, want %d in order; first difference at %d",
					round, evs[a].AggregateID, len(got), len(want), firstDiff(got, want))
			}
		}
		if t.Failed() {
			return
		}
	}
}

package kafka

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// rejectContaining makes c answer INVALID_RECORD, without storing anything,
// for every produce request with a record batch that holds poison, as a
// broker validating records rejects a whole batch for one bad record.
func rejectContaining(c *kfake.Cluster, poison []byte) {
	dec := kgo.DefaultDecompressor()
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		pr := req.(*kmsg.ProduceRequest)
		bad := false
		for _, rt := range pr.Topics {
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				if b.ReadFrom(rp.Records) != nil {
					continue
				}
				raw, err := dec.Decompress(b.Records, kgo.CompressionCodecType(b.Attributes&0x07))
				bad = bad || err == nil && bytes.Contains(raw, poison)
			}
		}
		if !bad {
			return nil, nil, false
		}
		return failedProduce(pr, kerr.InvalidRecord.Code), nil, true
	})
}

// TestRejectedBatchDeadLettersItsCulpritOnly publishes the events of 20
// aggregates that share a partition through the pipeline while the broker
// rejects every batch holding one poisoned event as an invalid record:
// only the poisoned event is dead-lettered, every other event is stored,
// and each aggregate's first deliveries are in order. franz-go fails every
// record buffered in the partition with the rejected batch's error, so
// before the sink republished such records alone to learn whose fault it
// was, the events of other aggregates that shared or followed the batch
// were dead-lettered as invalid too (160 of 200). The linger is long enough
// for each publish to go in one request: one split between requests, the
// first rejected while the call still produces, is the case docs/design.md
// (Hot aggregates) leaves open.
func TestRejectedBatchDeadLettersItsCulpritOnly(t *testing.T) {
	const aggregates, perAggregate = 20, 10
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{Linger: 200 * time.Millisecond})
	poison := []byte("poisoned-by-the-application")
	var evs []*event.Event
	for i := range aggregates * perAggregate {
		e := testEvent(i, "order", fmt.Sprint(i%aggregates))
		e.Position = uint64(i + 1)
		if i == 7*aggregates+3 {
			e.Payload = poison
		}
		evs = append(evs, e)
	}
	rejectContaining(c, poison)
	deadLetters, _ := sinktest.Drive(t, s, evs, hotOptions())

	culprit := evs[7*aggregates+3].ID
	if ids := deadIDs(deadLetters); !slices.Equal(ids, []string{culprit}) {
		t.Fatalf("%d dead letters, want only the poisoned event %s: %v", len(ids), culprit, ids[:min(len(ids), 5)])
	}
	first := map[string][]string{} // aggregate -> ids in order of first delivery
	seen := map[string]bool{}
	for _, r := range readTopics(t, c.ListenAddrs(), "t") {
		id, _ := header(r, "message_id")
		if !seen[id] {
			seen[id] = true
			first[string(r.Key)] = append(first[string(r.Key)], id)
		}
	}
	for a := range aggregates {
		var want []string
		for i := a; i < len(evs); i += aggregates {
			if evs[i].ID != culprit {
				want = append(want, evs[i].ID)
			}
		}
		if got := first[fmt.Sprint(a)]; !slices.Equal(got, want) {
			t.Errorf("aggregate %d: %d first deliveries, want %d in order; first difference at %d", a, len(got), len(want), firstDiff(got, want))
		}
	}
}

package kafka

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRunPartitioner calls the partitioner of a topic with one partition
// the way franz-go does (again, after OnNewBatch, for a record that would
// start a new batch): a run's later record is admitted only into the batch
// its first record went to.
func TestRunPartitioner(t *testing.T) {
	type step struct {
		rec      int  // index of the record: 0-3 of the run, 4 another key
		newBatch bool // the record would start a new batch
		want     bool // admitted
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"one batch", []step{{0, false, true}, {1, false, true}, {2, false, true}}},
		{"first starts the batch", []step{{0, true, true}, {1, false, true}, {2, false, true}}},
		{"later starts a batch", []step{{0, false, true}, {1, false, true}, {2, true, false}, {3, false, false}}},
		{"another key started one", []step{{0, false, true}, {4, true, true}, {1, false, false}, {2, false, false}}},
		{"another key's batch before", []step{{4, true, true}, {0, false, true}, {1, false, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := runPartitioner{}.ForTopic("t").(*topicRuns)
			gs := newAggGuards(context.Background(), 4)
			defer gs.release()
			recs := make([]*kgo.Record, 5)
			marks := make([]*member, 5)
			for i := range recs {
				k := "run"
				if i == 4 {
					k = "other"
				}
				recs[i] = &kgo.Record{Key: []byte(k), Context: context.Background()}
				gs.count(k)
			}
			for i := range 4 {
				marks[i] = gs.of("run").member(recs[i])
			}
			for _, s := range tc.steps {
				r := recs[s.rec]
				part := p.Partition(r, 1)
				if s.newBatch && part >= 0 {
					p.OnNewBatch()
					part = p.Partition(r, 1)
				}
				if got := part >= 0; got != s.want || marks[s.rec].refusedRecord() == got {
					t.Fatalf("record %d (new batch %v): partition %d, refused %v; want admitted %v", s.rec, s.newBatch, part, marks[s.rec].refusedRecord(), s.want)
				}
			}
		})
	}
}

// TestRunPartitionerRefusesAfterFailureOrPurge: a later record of a run is
// refused, even where it would join a batch numbered as its first
// record's, once a record of the run failed, or when the topic's
// partitioner is a new one (franz-go makes one after the topic was purged
// from producing): its batch is not the first record's.
func TestRunPartitionerRefusesAfterFailureOrPurge(t *testing.T) {
	for _, purge := range []bool{false, true} {
		p := runPartitioner{}.ForTopic("t").(*topicRuns)
		gs := newAggGuards(context.Background(), 2)
		head := &kgo.Record{Key: []byte("run"), Context: context.Background()}
		later := &kgo.Record{Key: []byte("run"), Context: context.Background()}
		gs.count("run")
		gs.count("run")
		gs.of("run").member(head)
		m := gs.of("run").member(later)
		p.OnNewBatch()
		if p.Partition(head, 1) != 0 {
			t.Fatal("the run's first record refused")
		}
		if purge {
			p = runPartitioner{}.ForTopic("t").(*topicRuns)
			p.OnNewBatch()
			p.Partition(&kgo.Record{Key: []byte("other"), Context: context.Background()}, 1) // batch 1 of the new partitioner
		} else {
			gs.of("run").fail(errors.New("rejected"))
		}
		if part := p.Partition(later, 1); part >= 0 || !m.refusedRecord() {
			t.Errorf("purge %v: the later record went to partition %d", purge, part)
		}
		gs.release()
	}
}

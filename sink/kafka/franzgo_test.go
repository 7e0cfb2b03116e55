package kafka

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// checkedFranzGo is the franz-go version whose behaviours the partitioner
// relies on (see Runs in runs.go) were last checked. The tests below pin
// them; TestFranzGoVersionChecked fails once go.mod names another version.
const checkedFranzGo = "v1.22.3"

// franzGoBehaviourTests name the tests to re-run, and read, after an
// upgrade of franz-go: the four behaviours, and the order the sink keeps
// through rejected batches with them.
const franzGoBehaviourTests = "TestFranzGoPartitionsAgainOnNewBatch (Partition asked again after OnNewBatch under the " +
	"partitioning lock, no other path makes batches, Record.Context reaches the partitioner), " +
	"TestFranzGoNegativePartitionFailsOneRecord (a negative pick fails that record alone), " +
	"TestSinkDoesNotStreamCompress (StreamingCompression stays off), and TestRejectedBatchesKeepOrder, " +
	"TestHotAggregateFailureMidWindow, TestNoRecordAfterFailedBatch, TestRunPartitioner*"

// TestFranzGoVersionChecked fails when the module's go.mod requires
// another franz-go than checkedFranzGo, or replaces it, so an upgrade
// cannot slip past the checks of the undocumented behaviours
// runPartitioner relies on. (A test binary carries no module versions to
// read with debug.ReadBuildInfo.)
func TestFranzGoVersionChecked(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	version := ""
	for line := range strings.Lines(string(mod)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		switch {
		case slices.Contains(f, "=>") && slices.Contains(f, "github.com/twmb/franz-go"):
			version = "a replacement"
		case len(f) >= 2 && f[0] == "github.com/twmb/franz-go":
			version = f[1]
		}
	}
	if version != checkedFranzGo {
		t.Fatalf("go.mod has franz-go %s, but sink/kafka's partitioner was checked against %s: run with -race, "+
			"and read, %s; check that the four behaviours in runs.go (Runs) still hold in franz-go's producer.go "+
			"(Client.doPartition) and sink.go (recBuf.bufferRecord), then set checkedFranzGo in sink/kafka/franzgo_test.go to it",
			version, checkedFranzGo, franzGoBehaviourTests)
	}
}

// recordingPartitioner partitions every record to partition 0 and records
// franz-go's calls. Its state is not synchronized: franz-go must call it
// under the topic's partitioning lock, or the race detector reports it.
type recordingPartitioner struct {
	calls    []string // "p <record index>" or "new batch"
	contexts int      // records whose Context reached Partition
}

type recordIndex struct{}

func (p *recordingPartitioner) ForTopic(string) kgo.TopicPartitioner { return p }

func (p *recordingPartitioner) RequiresConsistency(*kgo.Record) bool { return true }

func (p *recordingPartitioner) OnNewBatch() { p.calls = append(p.calls, "new batch") }

func (p *recordingPartitioner) Partition(r *kgo.Record, _ int) int {
	i, ok := r.Context.Value(recordIndex{}).(int)
	if ok {
		p.contexts++
	}
	p.calls = append(p.calls, fmt.Sprint("p ", i))
	return 0
}

// batchCounter counts the batches written.
type batchCounter struct{ n atomic.Int64 }

func (b *batchCounter) OnProduceBatchWritten(kgo.BrokerMetadata, string, int32, kgo.ProduceBatchMetrics) {
	b.n.Add(1)
}

// TestFranzGoPartitionsAgainOnNewBatch produces 400 records from two
// goroutines into one partition with 2 KiB batches: every OnNewBatch comes
// right after the Partition call of a record and is followed by another
// of the same record, every batch written was announced by an OnNewBatch
// (franz-go makes batches nowhere else), each record's Context reached
// Partition, and the race detector sees the partitioner called under a
// lock.
func TestFranzGoPartitionsAgainOnNewBatch(t *testing.T) {
	const n = 400
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	p := &recordingPartitioner{}
	var batches batchCounter
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(p),
		kgo.ProducerBatchMaxBytes(2048), kgo.ProducerLinger(20*time.Millisecond), kgo.WithHooks(&batches))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 2 {
		wg.Go(func() {
			for i := g; i < n; i += 2 {
				r := &kgo.Record{Topic: "t", Key: []byte("k"), Value: make([]byte, 100),
					Context: context.WithValue(context.Background(), recordIndex{}, i)}
				wg.Add(1)
				cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Add(1)
					}
					wg.Done()
				})
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d records failed", failed.Load())
	}
	// franz-go may call the hook of a batch after its promises.
	for deadline := time.Now().Add(5 * time.Second); batches.n.Load() < int64(countNewBatches(p.calls)) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	newBatches := countNewBatches(p.calls)
	for i, call := range p.calls {
		if call == "new batch" && (i == 0 || i+1 == len(p.calls) || p.calls[i-1] == "new batch" || p.calls[i+1] != p.calls[i-1]) {
			t.Fatalf("call %d, OnNewBatch, is not between two Partition calls of one record: %v", i, p.calls[max(0, i-2):min(len(p.calls), i+3)])
		}
	}
	if got := int(batches.n.Load()); newBatches != got || got < 2 {
		t.Errorf("%d OnNewBatch calls, %d batches written; want as many, and several", newBatches, got)
	}
	if p.contexts != n+newBatches {
		t.Errorf("the records' Context reached %d of %d Partition calls", p.contexts, n+newBatches)
	}
}

// countNewBatches counts the OnNewBatch calls among calls.
func countNewBatches(calls []string) int {
	n := 0
	for _, c := range calls {
		if c == "new batch" {
			n++
		}
	}
	return n
}

// refusingPartitioner partitions to 0 and refuses (-1) the records whose
// key is "refuse", and, after OnNewBatch, the record whose key is
// "refuse on new batch".
type refusingPartitioner struct{ newBatch bool }

func (p *refusingPartitioner) ForTopic(string) kgo.TopicPartitioner { return p }

func (p *refusingPartitioner) RequiresConsistency(*kgo.Record) bool { return true }

func (p *refusingPartitioner) OnNewBatch() { p.newBatch = true }

func (p *refusingPartitioner) Partition(r *kgo.Record, _ int) int {
	newBatch := p.newBatch
	p.newBatch = false
	if k := string(r.Key); k == "refuse" || k == "refuse on new batch" && newBatch {
		return -1
	}
	return 0
}

// TestFranzGoNegativePartitionFailsOneRecord produces records to one
// partition with a partitioner that refuses two of them, one on the first
// Partition call and one on the call after OnNewBatch: the promises of
// those two report an error, and the others are stored, in order.
func TestFranzGoNegativePartitionFailsOneRecord(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(&refusingPartitioner{}),
		kgo.ProducerLinger(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(keys ...string) []error {
		errs := make([]error, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Add(1)
			cl.Produce(context.Background(), &kgo.Record{Topic: "t", Key: []byte(k)}, func(_ *kgo.Record, err error) {
				errs[i] = err
				wg.Done()
			})
		}
		if err := cl.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		return errs
	}
	first := produce("a", "refuse", "b")
	second := produce("refuse on new batch", "c")
	for i, err := range append(first, second...) {
		if refused := i == 1 || i == 3; refused != (err != nil) {
			t.Errorf("record %d: %v", i, err)
		}
	}
	var got []string
	for _, r := range readTopics(t, c.ListenAddrs(), "t") {
		got = append(got, string(r.Key))
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("the topic holds %q, want %q", got, want)
	}
}

// TestSinkDoesNotStreamCompress checks that the sink's producer, and the
// one of transactions, which share clientOptions, leave
// kgo.StreamingCompression off: it merges buffered batches, a path that
// makes batches without asking the partitioner.
func TestSinkDoesNotStreamCompress(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	kopts, err := s.clientOptions("relay-1")
	if err != nil {
		t.Fatal(err)
	}
	txnCl, err := kgo.NewClient(kopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer txnCl.Close()
	for _, cl := range []*kgo.Client{s.cl, txnCl} {
		if on, _ := cl.OptValue(kgo.StreamingCompression).(bool); on {
			t.Error("a producer of the sink streams compression")
		}
	}
}

package kafka

import (
	"context"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// # Runs
//
// A run is the records of one aggregate in one Publish call, when there are
// several. franz-go fails every record buffered in a partition when the
// broker rejects one of its batches, but a record produced after that starts
// a new sequence under a new producer epoch, which the broker stores ahead
// of the failed records' retry. franz-go reports the failure only through
// the records' promises, from its own goroutine, after it failed the
// batches, so the producing goroutine cannot see it in time. What it can see
// is the partitioner, which franz-go asks under the topic's partitioning
// lock, again before a record starts a new batch. So the sink's partitioner
// (runPartitioner) keeps a run in one record batch: it admits the first
// record of a run wherever it goes and a later one only into the same
// batch; it refuses a later record that would start a new batch or join
// one that another record started since (after the first's batch was sent
// or failed), and every record of the run after it. A record batch is
// stored or rejected whole, so nothing of a run is stored after an earlier
// record of it failed. The refused records are not produced (their promise
// reports sink.ErrHeldBack) and go in a later call. The pipeline publishes
// an aggregate's next events only after the earlier ones were acknowledged
// or failed, so nothing of the aggregate that a rejection could fail is in
// the client ahead of a run's first record (see docs/design.md, Hot
// aggregates).

// aggGuards hold the run of each aggregate with more than one record in a
// Publish call. A failure of one of its records stops the producing of the
// run, and the records of a run share a context that the failure cancels,
// which fails those produced meanwhile that are not sent yet. A nil
// *aggGuard guards nothing.
type aggGuards struct {
	ctx    context.Context
	counts map[string]int
	guards map[string]*aggGuard
}

// aggGuard is the state of one run. head, part and batch are used only
// by the partitioner of the run's topic, under franz-go's lock of the
// topic.
type aggGuard struct {
	ctx    context.Context
	cancel context.CancelFunc
	bad    atomic.Bool // a record failed
	cut    atomic.Bool // the partitioner refused a record

	head  *kgo.Record // the first record partitioned
	runs  *topicRuns  // by this partitioner
	part  int         // its partition
	batch uint64      // and its batch there, counted from the topicRuns' first
}

func newAggGuards(ctx context.Context, n int) *aggGuards {
	return &aggGuards{ctx: ctx, counts: make(map[string]int, n), guards: make(map[string]*aggGuard)}
}

// count counts a record of aggregate key k.
func (gs *aggGuards) count(k string) { gs.counts[k]++ }

// of returns the guard of k, or nil when k has one record in the call.
func (gs *aggGuards) of(k string) *aggGuard {
	if gs.counts[k] < 2 {
		return nil
	}
	g := gs.guards[k]
	if g == nil {
		g = &aggGuard{}
		g.ctx, g.cancel = context.WithCancel(gs.ctx)
		gs.guards[k] = g
	}
	return g
}

// release cancels every guard's context.
func (gs *aggGuards) release() {
	for _, g := range gs.guards {
		g.cancel()
	}
}

// context returns the context to produce a record of g's aggregate with.
func (g *aggGuard) context(ctx context.Context) context.Context {
	if g == nil {
		return ctx
	}
	return g.ctx
}

// fail records err, the outcome of one of g's records, when it is a failure.
func (g *aggGuard) fail(err error) {
	if g != nil && err != nil {
		g.bad.Store(true)
		g.cancel()
	}
}

// stopped reports whether a record of g's run failed or was refused: the
// run's later records are not to be produced.
func (g *aggGuard) stopped() bool { return g != nil && (g.bad.Load() || g.cut.Load()) }

// member marks r as a record of g's run for the partitioner and returns
// the mark, which says after r's promise whether the partitioner refused
// it. It returns nil, leaving r as it is, when g is nil.
func (g *aggGuard) member(r *kgo.Record) *member {
	if g == nil {
		return nil
	}
	m := &member{g: g}
	r.Context = context.WithValue(context.Background(), memberKey{}, m)
	return m
}

// member is a record of a run.
type member struct {
	g       *aggGuard
	refused atomic.Bool
}

// memberKey is the context key of a record's *member.
type memberKey struct{}

// refusedRecord reports whether m is a record the partitioner refused; a
// nil *member was never refused.
func (m *member) refusedRecord() bool { return m != nil && m.refused.Load() }

// admit reports whether the record m may go to partition part of p, whose
// made batches were made so far, where it makes a new batch when newBatch
// is set: yes for the run's first record, and for a later one that joins
// the batch the first went to, of the same partitioner (franz-go makes a
// new one when a topic is purged), until one failed or was refused.
func (m *member) admit(p *topicRuns, r *kgo.Record, part int, made uint64, newBatch bool) bool {
	g := m.g
	if newBatch {
		made++ // the batch r would make
	}
	switch {
	case g.cut.Load():
	case g.head == nil || g.head == r:
		g.head, g.runs, g.part, g.batch = r, p, part, made
		return true
	case !newBatch && !g.bad.Load() && p == g.runs && part == g.part && made == g.batch:
		return true
	default:
		g.cut.Store(true)
	}
	m.refused.Store(true)
	return false
}

// runPartitioner partitions records by key as Kafka does (murmur2, as
// franz-go's default partitioner for records with a key) and keeps each
// run in one record batch (see Runs above).
type runPartitioner struct{}

// ForTopic implements kgo.Partitioner.
func (runPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return &topicRuns{keys: kgo.StickyKeyPartitioner(nil).ForTopic(topic), made: make(map[int]uint64)}
}

// topicRuns partitions the records of one topic. franz-go calls it for one
// record at a time: Partition, then, when the record would start a new
// batch in that partition, OnNewBatch and Partition again. franz-go makes a
// partition's batches nowhere else (unless kgo.StreamingCompression is set,
// which merges buffered batches: the sink must not set it), so made, which counts the batches made
// per partition, tells whether a record joins the batch an earlier one
// went to.
type topicRuns struct {
	keys     kgo.TopicPartitioner
	newBatch bool // OnNewBatch was called for the record being partitioned
	made     map[int]uint64
}

// RequiresConsistency implements kgo.TopicPartitioner.
func (p *topicRuns) RequiresConsistency(r *kgo.Record) bool { return p.keys.RequiresConsistency(r) }

// OnNewBatch implements kgo.TopicPartitionerOnNewBatch.
func (p *topicRuns) OnNewBatch() { p.newBatch = true }

// Partition implements kgo.TopicPartitioner. It returns -1, which fails the
// record without buffering it, for a record of a run that must not go
// where it would.
func (p *topicRuns) Partition(r *kgo.Record, n int) int {
	newBatch := p.newBatch
	p.newBatch = false
	part := p.keys.Partition(r, n)
	if m, _ := r.Context.Value(memberKey{}).(*member); m != nil && !m.admit(p, r, part, p.made[part], newBatch) {
		return -1
	}
	if newBatch {
		p.made[part]++
	}
	return part
}

package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/rowtext"
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
//
// This rests on four behaviours of franz-go that it does not document,
// which TestFranzGo* pin for the version in checkedFranzGo: Partition is
// asked again after OnNewBatch, under the topic's partitioning lock; a
// negative partition fails that record alone; no other path makes a
// partition's batches; a record's Context reaches the partitioner. Should
// an upgrade break one of them unnoticed, checkRuns makes it loud.

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

// isRun reports whether k has more than one record in the call.
func (gs *aggGuards) isRun(k string) bool { return gs.counts[k] > 1 }

// of returns the guard of k, or nil when k has one record in the call.
func (gs *aggGuards) of(k string) *aggGuard {
	if !gs.isRun(k) {
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

// errRunBroken fails the events of a run from the first record the broker
// did not store where the run's one batch would have put it.
var errRunBroken = errors.New("the broker did not store the records of this event's aggregate in one batch")

// checkRuns checks that the broker stored the acknowledged records of each
// run the way one record batch holds them: in one partition, under one
// producer id and epoch, at offsets that increase in produce order. (Not
// consecutive ones: records of other aggregates, of this call or of a
// concurrent one, may sit between them in the batch.) A record that breaks
// this, and every acknowledged record of its run after it, fail as
// unavailable: the order may already be broken on the topic, which is no
// fault of the events, and publishing them again puts them, in order,
// after everything stored. The break is logged as an error and counted
// (see RunBreaks).
func (p *publish) checkRuns() {
	prev := make(map[string]*kgo.Record) // key -> its run's last acknowledged record
	broken := make(map[string]error)     // key -> the failure of its run's first record out of place
	for i := range p.batch {
		k := p.keys[i]
		if !p.acked[i] || p.errs[i] != nil || !p.guards.isRun(k) {
			continue
		}
		r, q := p.recs[i], prev[k]
		prev[k] = r
		switch {
		case broken[k] != nil:
			p.errs[i] = broken[k]
		case q != nil && !sameBatch(q, r):
			broken[k] = p.runBroken(i, q)
			p.errs[i] = broken[k]
		}
	}
}

// sameBatch reports whether r, acknowledged after q, may be stored in the
// batch that holds q.
func sameBatch(q, r *kgo.Record) bool {
	return r.Partition == q.Partition && r.ProducerID == q.ProducerID &&
		r.ProducerEpoch == q.ProducerEpoch && r.Offset > q.Offset
}

// runBroken logs and counts the break of a run at event i's record, which
// the broker did not store in the batch of q, the run's previous record,
// and returns the failure of event i.
func (p *publish) runBroken(i int, q *kgo.Record) error {
	r := p.recs[i]
	n := p.s.runBreaks.Add(1)
	p.s.opts.Logger.Error("kafka: the broker did not store one publish's records of an aggregate in one batch; the aggregate's order on the topic may be broken, so its events from this one on are published again",
		"topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
		"producer_id", r.ProducerID, "producer_epoch", r.ProducerEpoch,
		"previous_partition", q.Partition, "previous_offset", q.Offset,
		"previous_producer_id", q.ProducerID, "previous_producer_epoch", q.ProducerEpoch,
		"event", rowtext.Value(p.batch[i].ID), "breaks", n)
	return fault.AsUnavailable(fmt.Errorf("%w: stored at offset %d of partition %d by producer %d epoch %d, after offset %d of partition %d by producer %d epoch %d",
		errRunBroken, r.Offset, r.Partition, r.ProducerID, r.ProducerEpoch, q.Offset, q.Partition, q.ProducerID, q.ProducerEpoch))
}

// RunBreaks returns how many times, since the sink was made, the broker
// acknowledged the records of one aggregate in one publish other than as
// one batch would hold them (see docs/design.md, Hot aggregates). It
// should stay 0; see checkRuns. Safe for concurrent use.
func (s *Sink) RunBreaks() int64 { return s.runBreaks.Load() }

package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"

	"net"
	"regexp"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// Publish produces every event of batch without waiting in between, in
// batch order, then waits for each acknowledgement, for at most AckTimeout.
// It returns nil when all were acknowledged and a *sink.BatchError
// otherwise. Several events of one aggregate may share a batch (see
// MaxPerAggregate): once one of them fails, the later ones fail too, with
// sink.ErrHeldBack when they were not produced. The events of one
// aggregate that Publish produces go in one record batch of their topic,
// and the rest are held back (see records and the runs in runs.go); should
// the acknowledgements show otherwise, Publish fails the events from the
// first one out of place (see checkRuns).
//
// Before the first publish to a topic, Publish makes sure the topic exists
// (see docs/design.md, Kafka). Errors are classified by classify.
// Publish is safe for concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.opts.AckTimeout)
	// Cancelling fails the records of this batch that were not sent yet
	// when Publish gives up, and with them the records queued behind them
	// in their partitions, which is safe (see docs/design.md, Kafka).
	defer cancel()

	p := s.newPublish(ctx, batch)
	defer p.guards.release()
	p.prepare()
	p.recs = s.records(batch, p.topics, p.keys, p.errs)
	t, err := s.enterTxn()
	if err != nil {
		return err
	}
	p.t = t
	p.recorded = s.recordedIn(t, batch)
	p.produce()
	if t != nil {
		s.txn.leave()
	}
	p.wait()
	if t != nil {
		p.commit(parent)
	} else {
		s.retryAlone(ctx, p.recs, p.keys, p.errs, p.settled)
	}
	p.checkRuns()
	return p.report()
}

// publish is the state of one Publish call. Only the calling goroutine
// uses it, but for results, which the records' promises send on.
type publish struct {
	s      *Sink
	ctx    context.Context // ends after AckTimeout
	batch  []*event.Event
	topics []string
	keys   []string // topic and ordering key
	errs   []error
	guards *aggGuards

	recs     []*kgo.Record
	t        *txn   // the open transaction; nil when not transactional
	recorded []bool // events a committed transaction recorded as published

	results chan result // the promises' outcomes; never blocks
	pending int         // records produced and not settled
	settled []bool      // events whose record's promise reported
	acked   []bool      // events whose record the broker acknowledged
	waitErr error       // why the wait for the pending ones ended
}

// result is the outcome a record's promise reports for event i.
type result struct {
	i   int
	err error
}

// newPublish starts the publish of batch within ctx: it renders each
// event's topic and key and counts the events of each key.
func (s *Sink) newPublish(ctx context.Context, batch []*event.Event) *publish {
	p := &publish{
		s:       s,
		ctx:     ctx,
		batch:   batch,
		topics:  make([]string, len(batch)),
		keys:    make([]string, len(batch)),
		errs:    make([]error, len(batch)),
		guards:  newAggGuards(ctx, len(batch)),
		results: make(chan result, len(batch)),
		settled: make([]bool, len(batch)),
		acked:   make([]bool, len(batch)),
	}
	for i, e := range batch {
		p.topics[i] = s.topicOf(e)
		p.keys[i] = p.topics[i] + "\x00" + e.Key()
		p.guards.count(p.keys[i])
	}
	return p
}

// prepare fails the events whose topic name is invalid (permanent), or
// cannot be made ready (see ready), or that the envelope refuses. Each
// topic is made ready once per call.
func (p *publish) prepare() {
	prepared := make(map[string]error)
	for i, e := range p.batch {
		if err := destname.KafkaTopic(p.topics[i]); err != nil {
			p.errs[i], p.topics[i] = fault.AsPermanent(err), "an invalid topic"
			continue
		}
		err, seen := prepared[p.topics[i]]
		if !seen {
			err = p.s.ready(p.ctx, p.topics[i])
			prepared[p.topics[i]] = err
		}
		if err == nil && p.s.opts.Envelope != nil {
			err = p.s.opts.Envelope.Check(e)
		}
		p.errs[i] = err
	}
}

// produce produces, in batch order, the record of every event not failed,
// held back or recorded yet, into the transaction when there is one. Once
// an aggregate's record failed or was refused, or the context ended, its
// later events are held back (or fail with the context's error). Every
// record is built before the first is produced, so that the records of one
// aggregate follow each other closely.
func (p *publish) produce() {
	stopped := make(map[string]bool) // keys whose later events are held back
	for i := range p.batch {
		k := p.keys[i]
		g := p.guards.of(k)
		if p.errs[i] != nil || p.recorded[i] {
			continue
		}
		if stopped[k] || g.stopped() {
			p.errs[i], stopped[k] = sink.ErrHeldBack, true
			continue
		}
		if p.ctx.Err() != nil {
			// Produce buffers a record even with a done context when the
			// client has room; a later record of the key must not be.
			p.errs[i], stopped[k] = p.s.explain(p.ctx.Err()), true
			continue
		}
		p.pending++
		cl := p.s.cl
		if p.t != nil {
			p.t.add()
			cl = p.t.cl
		}
		cl.Produce(g.context(p.ctx), p.recs[i], p.promise(i, g))
	}
}

// promise returns the promise of event i's record, of g's run: it reports
// the outcome on results, to g and to the transaction. A record the
// partitioner refused reports sink.ErrHeldBack.
func (p *publish) promise(i int, g *aggGuard) func(*kgo.Record, error) {
	m := g.member(p.recs[i])
	id := p.batch[i].ID
	return func(_ *kgo.Record, err error) {
		if m.refusedRecord() {
			err = sink.ErrHeldBack
		} else {
			g.fail(err)
		}
		if p.t != nil {
			p.t.ack(id, err)
		}
		p.results <- result{i, err}
	}
}

// wait collects the promises' outcomes until every produced record
// settled, the context ends (not in a transaction: a record given up on
// could still be appended and committed, and then be published again), or
// the sink is closed; waitErr says which.
func (p *publish) wait() {
	timeout := p.ctx.Done()
	if p.t != nil {
		timeout = nil
	}
	for p.pending > 0 && p.waitErr == nil {
		select {
		case r := <-p.results:
			p.pending--
			p.settled[r.i], p.errs[r.i], p.acked[r.i] = true, r.err, r.err == nil
			if r.err == nil && p.s.onAck != nil {
				p.s.onAck(p.recs[r.i])
			}
		case <-timeout:
			p.waitErr = p.s.explain(p.ctx.Err())
		case <-p.s.closed:
			p.waitErr = errClosed
		}
	}
}

// commit waits, within parent, for the transaction that holds the records
// to end, when any settled, and fails the acknowledged ones when it did
// not commit.
func (p *publish) commit(parent context.Context) {
	if !slices.Contains(p.settled, true) {
		return
	}
	if err := p.t.wait(parent); err != nil {
		for i := range p.batch {
			if p.settled[i] && p.errs[i] == nil {
				p.errs[i] = err
			}
		}
	}
}

// report returns the call's outcome: nil when every event was published
// (or recorded), else a *sink.BatchError with each failure classified and
// naming its event and topic. The events after an aggregate's first
// failure fail as sink.ErrHeldBack carrying its class; one of them that
// was stored anyway is logged as an error (its aggregate's order may be
// broken), unless in a transaction.
func (p *publish) report() error {
	failed := false
	firstErr := make(map[string]error) // key -> failure of its first failed event
	for i, e := range p.batch {
		if p.recorded[i] {
			p.errs[i] = nil
			continue
		}
		err := p.errs[i]
		if err == nil && !p.settled[i] {
			err = p.waitErr
		}
		first, after := firstErr[p.keys[i]]
		if err == nil && !after {
			continue
		}
		if err == nil && p.t == nil {
			p.s.opts.Logger.Error("kafka: an event was stored after an earlier event of its aggregate failed; the aggregate's order on the topic may be broken",
				"topic", p.topics[i], "event", e.ID)
		}
		failed = true
		switch {
		case after:
			// Carries the class of the first failure.
			err = fmt.Errorf("%w (%w)", sink.ErrHeldBack, first)
		case !errors.Is(err, sink.ErrHeldBack):
			if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
				p.s.forget(p.topics[i])
			}
			err = classifyRecord(err, e)
		}
		p.errs[i] = fmt.Errorf("publish %s to %s: %w", e.ID, p.topics[i], err)
		if !after {
			firstErr[p.keys[i]] = p.errs[i]
		}
	}
	if failed {
		return &sink.BatchError{Errs: p.errs}
	}
	return nil
}

// records builds the record of every event of batch to topics, and marks
// the events not to produce in this call, by their keys (topic and ordering
// key): errs[i] is set for an event that cannot be published and becomes
// sink.ErrHeldBack for each later event of its aggregate. Besides those,
// an aggregate's events are held back
//   - after a record that may be too large for a batch of its topic, and
//     from such a record on when it is not the aggregate's first: the
//     client fails such a record on its own, without the records behind it;
//   - once its records would no longer fit in one batch of the topic (its
//     first record always goes): the partitioner would refuse the record
//     that starts a second batch anyway (see runPartitioner).
func (s *Sink) records(batch []*event.Event, topics, keys []string, errs []error) []*kgo.Record {
	recs := make([]*kgo.Record, len(batch))
	run := make(map[string]int)   // bytes of each key's records to produce
	held := make(map[string]bool) // keys whose later events are held back
	for i, e := range batch {
		r := record(e, topics[i], s.rows)
		if env := s.opts.Envelope; env != nil {
			env.Binary(e, envelope.Kafka, func(k, v string) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) })
		}
		recs[i] = r
		k := keys[i]
		n, limit := recordBytes(r), int(s.maxMessageBytes(topics[i]))-batchMargin
		large := n > limit
		_, seen := run[k]
		if held[k] || seen && run[k]+n > limit {
			errs[i], held[k] = sink.ErrHeldBack, true
			continue
		}
		run[k] += n
		if errs[i] != nil || large {
			held[k] = true
		}
	}
	return recs
}

// enterTxn returns the open transaction, which the caller must leave, or
// nil when the sink is not transactional. While none is open (before
// Recover, and while a fenced producer is replaced) it fails as
// fault.Unavailable and asks the committer to recover.
func (s *Sink) enterTxn() (*txn, error) {
	if s.txn == nil {
		return nil, nil
	}
	t := s.txn.enter()
	if t == nil {
		s.txn.wake()
		return nil, errNoTxn
	}
	return t, nil
}

// recordedIn reports, for each event of batch, whether a committed
// transaction recorded it as published (see Recorded), when t is open:
// such an event, of a batch captured before another relay published it,
// is reported published and not produced again.
func (s *Sink) recordedIn(t *txn, batch []*event.Event) []bool {
	if t == nil {
		return make([]bool, len(batch))
	}
	ids := make([]string, len(batch))
	for i, e := range batch {
		ids[i] = e.ID
	}
	return s.Recorded(ids)
}

// MaxPerAggregate implements sink.Ordered: within a partition, the
// idempotent producer keeps records in order and fails every record behind
// a failed one, so a batch may carry as many events of one aggregate as the
// client can buffer; Publish produces those that go in one record batch of
// the topic and holds back the rest (see docs/design.md, Hot aggregates).
func (s *Sink) MaxPerAggregate() int { return s.opts.MaxBufferedRecords }

// recordBytes over-estimates the bytes r takes in a record batch.
func recordBytes(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + recordMargin
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// Framing over-estimates, in bytes: recordMargin of a record's (its
// length, attributes, deltas and field lengths), batchMargin of a record
// batch's and of the produce request around it.
const (
	recordMargin = 40
	batchMargin  = 512
)

// errClosed fails the publishes waiting for acks when the sink is closed.
var errClosed = errors.New("kafka sink closed")

// contractHeaders are the headers every record carries.
var contractHeaders = []string{"message_id", "event_type", "aggregate_type", "aggregate_id", "content-type"}

// record builds e's record: key e.Key(), value the payload, and the row
// headers rows forwards in name order followed by the contract headers.
// The key and the header values share one allocation.
func record(e *event.Event, topic string, rows *sink.HeaderFilter) *kgo.Record {
	contract := [...]string{e.ID, e.EventType, e.AggregateType, e.AggregateID, e.ContentType}
	names := make([]string, 0, len(e.Headers))
	for k := range e.Headers {
		names = append(names, k)
	}
	slices.Sort(names)
	n := len(e.Key())
	for _, v := range contract {
		n += len(v)
	}
	forwarded := names[:0]
	for _, k := range names {
		if rows.Forward(k) {
			forwarded = append(forwarded, k)
			n += len(e.Headers[k])
		}
	}
	buf := make([]byte, 0, n)
	headers := make([]kgo.RecordHeader, 0, len(forwarded)+len(contract))
	var v []byte
	for _, k := range forwarded {
		buf, v = appendBytes(buf, e.Headers[k])
		headers = append(headers, kgo.RecordHeader{Key: k, Value: v})
	}
	for i, s := range contract {
		buf, v = appendBytes(buf, s)
		headers = append(headers, kgo.RecordHeader{Key: contractHeaders[i], Value: v})
	}
	value := e.Payload
	if value == nil {
		value = []byte{} // a null value is a tombstone on compacted topics
	}
	_, key := appendBytes(buf, e.Key()) // never nil: an empty key is not a null one
	return &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headers}
}

// appendBytes appends s to buf, which must have room for it, and returns
// buf and the bytes of s in it, capped so that appending to them cannot
// overwrite what follows.
func appendBytes(buf []byte, s string) ([]byte, []byte) {
	i := len(buf)
	buf = append(buf, s...)
	return buf, buf[i:len(buf):len(buf)]
}

// batchBytes finds the batch size in franz-go's message for a batch the
// broker rejected as too large.
var batchBytes = regexp.MustCompile(`uncompressed_bytes=(\d+), compressed_bytes=`)

// classifyRecord classifies the failure of e's record. A broker rejects a
// whole batch as too large, so the events of other aggregates that shared
// the batch with an oversized one fail with MESSAGE_TOO_LARGE too; that
// only happens when the topic's limit could not be read, since the client
// otherwise cuts batches to it and fails an oversized record alone. Such an
// event is transient when the batch was clearly larger than the event.
func classifyRecord(err error, e *event.Event) error {
	if errors.Is(err, kerr.MessageTooLarge) {
		if m := batchBytes.FindStringSubmatch(err.Error()); m != nil {
			n, _ := strconv.Atoi(m[1])
			if n > 2*recordSize(e)+1024 {
				return fmt.Errorf("%w; the broker rejected the batch this event was part of, not necessarily the event itself", err)
			}
		}
	}
	return classify(err)
}

// recordSize approximates the encoded size of e's record.
func recordSize(e *event.Event) int {
	n := len(e.Key()) + len(e.AggregateID) + len(e.Payload) + len(e.ID) + len(e.EventType) + len(e.AggregateType) + len(e.ContentType) + 64
	for k, v := range e.Headers {
		n += len(k) + len(v) + 2
	}
	return n
}

// classify marks err with its fault.Class.
//
// Errors that say the event itself can never be accepted are permanent: too
// large for the topic, an invalid record, an invalid topic name. Errors
// that say the topic or the cluster cannot take any record right now are
// failures of the destination (unavailable): unreachable or restarting
// brokers, leader elections, too few in-sync replicas, no acknowledgement
// in time, a closed sink, failed authentication, no permission to write
// the topic, and a topic that does not exist. Everything else is
// transient and suspect (fault.AsSuspect): it counts against the event
// only while other events to the topic succeed.
//
// An error that already carries a class, such as one from preparing a
// topic, keeps it.
func classify(err error) error {
	var classified interface{ Retryable() bool }
	switch {
	case errors.As(err, &classified):
		return err
	case errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge),
		errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.InvalidRecord):
		return fault.AsPermanent(err)
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled),
		errors.Is(err, errClosed),
		errors.Is(err, kgo.ErrClientClosed),
		errors.Is(err, kgo.ErrRecordTimeout),
		errors.Is(err, kgo.ErrMaxBuffered),
		errors.Is(err, kerr.LeaderNotAvailable),
		errors.Is(err, kerr.NotLeaderForPartition),
		errors.Is(err, kerr.RequestTimedOut),
		errors.Is(err, kerr.BrokerNotAvailable),
		errors.Is(err, kerr.NetworkException),
		errors.Is(err, kerr.NotEnoughReplicas),
		errors.Is(err, kerr.NotEnoughReplicasAfterAppend),
		errors.Is(err, kerr.KafkaStorageError),
		errors.Is(err, kerr.PreferredLeaderNotAvailable),
		errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.UnknownTopicOrPartition),
		errors.Is(err, kerr.UnknownTopicID),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, new(net.Error)),
		isAuthError(err):
		return fault.AsUnavailable(err)
	}
	return fault.AsSuspect(err)
}

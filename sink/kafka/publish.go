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
// and the rest are held back (see records and the runs in runs.go).
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

	topics := make([]string, len(batch))
	keys := make([]string, len(batch)) // topic and ordering key
	errs := make([]error, len(batch))
	prepared := make(map[string]error)
	guards := newAggGuards(ctx, len(batch))
	defer guards.release()
	for i, e := range batch {
		topics[i] = s.topicOf(e)
		keys[i] = topics[i] + "\x00" + e.Key()
		guards.count(keys[i])
		if err := destname.KafkaTopic(topics[i]); err != nil {
			errs[i], topics[i] = fault.AsPermanent(err), "an invalid topic"
			continue
		}
		err, seen := prepared[topics[i]]
		if !seen {
			err = s.ready(ctx, topics[i])
			prepared[topics[i]] = err
		}
		if err == nil && s.opts.Envelope != nil {
			err = s.opts.Envelope.Check(e)
		}
		errs[i] = err
	}

	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(batch)) // promises never block
	pending := 0
	recs := s.records(batch, topics, keys, errs)
	stopped := make(map[string]bool) // keys whose later events are held back
	t, err := s.enterTxn()
	if err != nil {
		return err
	}
	recorded := s.recordedIn(t, batch)
	// Every record is built before the first is produced, so that the
	// records of one aggregate follow each other closely.
	for i, e := range batch {
		k, r := keys[i], recs[i]
		g := guards.of(k)
		if errs[i] != nil || recorded[i] {
			continue
		}
		if stopped[k] || g.stopped() {
			errs[i], stopped[k] = sink.ErrHeldBack, true
			continue
		}
		if ctx.Err() != nil {
			// Produce buffers a record even with a done context when the
			// client has room; a later record of the key must not be.
			errs[i], stopped[k] = s.explain(ctx.Err()), true
			continue
		}
		pending++
		m := g.member(r)
		promise := func(_ *kgo.Record, err error) {
			if m.refusedRecord() {
				err = sink.ErrHeldBack
			} else {
				g.fail(err)
			}
			if t != nil {
				t.ack(e.ID, err)
			}
			results <- result{i, err}
		}
		cl := s.cl
		if t != nil {
			t.add()
			cl = t.cl
		}
		cl.Produce(g.context(ctx), r, promise)
	}
	if t != nil {
		s.txn.leave()
	}

	settled := make([]bool, len(batch))
	var waitErr error
	// In a transaction every record is waited for: one given up on could
	// still be appended and committed, and then be published again.
	timeout := ctx.Done()
	if t != nil {
		timeout = nil
	}
	for pending > 0 && waitErr == nil {
		select {
		case r := <-results:
			pending--
			settled[r.i], errs[r.i] = true, r.err
		case <-timeout:
			waitErr = s.explain(ctx.Err())
		case <-s.closed:
			waitErr = errClosed
		}
	}
	if t != nil && slices.Contains(settled, true) {
		if err := t.wait(parent); err != nil {
			for i := range batch {
				if settled[i] && errs[i] == nil {
					errs[i] = err
				}
			}
		}
	}

	if t == nil {
		s.retryAlone(ctx, recs, keys, errs, settled)
	}

	failed := false
	firstErr := make(map[string]error) // key -> failure of its first failed event
	for i, e := range batch {
		if recorded[i] {
			errs[i] = nil
			continue
		}
		err := errs[i]
		if err == nil && !settled[i] {
			err = waitErr
		}
		first, after := firstErr[keys[i]]
		if err == nil && !after {
			continue
		}
		if err == nil && t == nil {
			s.opts.Logger.Error("kafka: an event was stored after an earlier event of its aggregate failed; the aggregate's order on the topic may be broken",
				"topic", topics[i], "event", e.ID)
		}
		failed = true
		switch {
		case after:
			// Carries the class of the first failure.
			err = fmt.Errorf("%w (%w)", sink.ErrHeldBack, first)
		case !errors.Is(err, sink.ErrHeldBack):
			if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
				s.forget(topics[i])
			}
			err = classifyRecord(err, e)
		}
		errs[i] = fmt.Errorf("publish %s to %s: %w", e.ID, topics[i], err)
		if !after {
			firstErr[keys[i]] = errs[i]
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
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

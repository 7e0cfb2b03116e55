package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/wait"
	"github.com/outboxrelay/relay/sink"
)

// # Transactions
//
// With Config.Transactional the sink produces in Kafka transactions under
// Config.TransactionalID, so consumers reading with isolation.level
// read_committed see an event once. Publish calls produce into the open
// transaction; one goroutine (commit) ends it as soon as it holds records
// and the previous one ended, so concurrent publishes share a commit.
// Publish returns success for an event only once the transaction holding
// its record committed.
//
// Each transaction also writes one record to the progress topic (compacted,
// one partition): key "<transactional id>/<slot>", a slot of progressSlots
// taken in turn, value the ids of the events this transaction holds plus
// those an earlier transaction wrote to the slot whose rows are not
// archived yet (Archived). The latest record of every slot therefore
// names, together, every event published in a committed transaction whose
// row may still be in the outbox. Recovery fences every other producer of
// the transactional id, reads those records, and keeps the ids whose rows
// are still unarchived in the outbox (sink.Unarchived), so the records stay
// bounded; the relay archives such rows without publishing them again
// (Recorded), and Publish itself reports an event so recorded as published
// without producing it.
//
// Recovery runs on a new transactional producer (a new client): first in
// Recover, and again whenever the producer cannot go on, because another
// producer of the transactional id fenced it (ProducerFenced,
// InvalidProducerEpoch) or because no transaction can begin. Until it
// succeeded Publish fails as fault.Unavailable and asks for it, so a relay
// that leads again after another one fenced it publishes again. Only one
// producer of an id can commit at a time, and each read what every other
// committed before it fenced them: an event is never committed twice, even
// when a relay that lost its lock still publishes batches it captured
// before (see docs/design.md, Kafka transactions).
//
// A commit whose outcome is unknown (an error from EndTransaction) is
// resolved from Kafka: the producer is fenced, a marker is committed, and
// the progress topic is read up to it; the transaction committed exactly
// when its progress record is there. Until then its publishes wait. When
// the producer was fenced meanwhile they fail instead; their retry, after
// recovery, finds the events recorded when the transaction committed.

// progressSlots is how many keys of the progress topic a relay writes in
// turn; recovery reads the latest record of each.
const progressSlots = 64

// ProgressTopic is the progress topic of transactional sinks, created when
// missing with progressConfigs.
const ProgressTopic = "_outbox_relay_progress"

// progressConfigs are the configs of a progress topic the sink creates:
// compacted, so the latest record of each slot stays, and with small
// segments, since compaction never cleans the active segment and recovery
// reads the topic from its start.
var progressConfigs = map[string]string{
	"cleanup.policy": "compact",
	"segment.bytes":  "8388608",
	"segment.ms":     "3600000",
}

// recoverTimeout bounds one recovery attempt.
const recoverTimeout = 30 * time.Second

// progress is the value of a progress record.
type progress struct {
	Run string   `json:"run"` // the writing process, a UUID
	Txn int64    `json:"txn"` // the transaction's number in that process
	IDs []string `json:"ids"`
}

// txns coordinates the transactions of a sink. Publish calls enter and
// leave the open transaction; the commit goroutine owns the producer and
// its transaction state, and recovers.
type txns struct {
	s *Sink
	// fails logs the runs of failed recoveries (see internal/outage).
	fails *outage.Log
	id    string // the transactional id
	run   string // this process, in progress records
	kick  chan struct{}
	gate  sync.RWMutex // held shared while producing, exclusively to end a transaction or recover

	recovering atomic.Bool // a recovery holds or waits for the gate

	mu         sync.Mutex
	cl         *kgo.Client // the transactional producer; nil before the first recovery
	cur        *txn        // the open transaction; nil until recovered, and after a fence
	failure    error       // the last recovery's error, nil after a success
	changed    chan struct{}
	unarchived sink.Unarchived // set by Recover
	seq        int64
	slots      [progressSlots]map[string]bool // ids published in committed transactions and not archived
	where      map[string]int                 // id -> its slot

	once   sync.Once     // starts the committer, or closes exited when the sink closes first
	exited chan struct{} // closed once the committer returned
}

// txn is one Kafka transaction, on producer cl.
type txn struct {
	seq      int64
	cl       *kgo.Client
	mu       sync.Mutex
	produced int
	settled  int
	acked    []string // ids of the records the broker appended
	failed   error    // the first record's error
	settle   chan struct{}
	done     chan struct{} // closed once err is final
	err      error         // nil when committed
}

func newTxns(s *Sink) *txns {
	return &txns{s: s, id: s.cfg.TransactionalID, run: uuid.NewString(), kick: make(chan struct{}, 1),
		fails: outage.New(s.opts.Logger, "kafka: recovering the transactional producer failed; retrying", "kafka: the transactional producer recovered"),
		where: map[string]int{}, changed: make(chan struct{}), exited: make(chan struct{})}
}

// newTxn returns the next transaction on cl. The caller holds mu.
func (x *txns) newTxn(cl *kgo.Client) *txn {
	x.seq++
	return &txn{seq: x.seq, cl: cl, settle: make(chan struct{}, 1), done: make(chan struct{})}
}

// enter returns the open transaction, holding it open until leave, or
// nil, holding nothing, when none is open.
func (x *txns) enter() *txn {
	if x.recovering.Load() {
		return nil
	}
	x.gate.RLock()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cur == nil {
		x.gate.RUnlock()
	}
	return x.cur
}

// leave lets the open transaction end and wakes the committer.
func (x *txns) leave() {
	x.gate.RUnlock()
	x.wake()
}

// wake asks the committer to end the open transaction, or to recover when
// none is open.
func (x *txns) wake() {
	select {
	case x.kick <- struct{}{}:
	default:
	}
}

// produced counts a record produced into t.
func (t *txn) add() {
	t.mu.Lock()
	t.produced++
	t.mu.Unlock()
}

// ack records the outcome of the record of event id.
func (t *txn) ack(id string, err error) {
	t.mu.Lock()
	t.settled++
	if err == nil {
		t.acked = append(t.acked, id)
	} else if t.failed == nil {
		t.failed = err
	}
	t.mu.Unlock()
	select {
	case t.settle <- struct{}{}:
	default:
	}
}

// wait returns the transaction's outcome: nil once it committed. It gives
// up only when ctx ends.
func (t *txn) wait(ctx context.Context) error {
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
		return fault.AsUnavailable(fmt.Errorf("transaction outcome not known yet: %w", ctx.Err()))
	}
}

func (t *txn) finish(err error) {
	t.err = err
	close(t.done)
}

// Recover makes sure a recovered transactional producer is ready: when
// none is (before the first call, and after a fence), it starts a new
// producer, which fences every other producer of the transactional id,
// reads the progress topic and keeps the ids unarchived reports still in
// the outbox. It returns at once while a producer is ready. The relay
// calls it before each batch it is about to publish, never while standing
// by (a standby must not fence the active relay). It retries until ctx
// ends, and returns at once an error classified fault.Permanent, such as a
// progress topic that is not compacted. Safe for concurrent use.
func (s *Sink) Recover(ctx context.Context, unarchived sink.Unarchived) error {
	x := s.txn
	if x == nil {
		return nil
	}
	x.mu.Lock()
	x.unarchived = unarchived
	x.mu.Unlock()
	x.once.Do(func() { go x.commit() })
	for {
		x.mu.Lock()
		open, failure, changed := x.cur != nil, x.failure, x.changed
		x.mu.Unlock()
		if open {
			return nil
		}
		if fault.ClassOf(failure) == fault.Permanent {
			return failure
		}
		x.wake()
		select {
		case <-changed:
		case <-ctx.Done():
			if failure == nil {
				failure = ctx.Err()
			}
			return fault.AsUnavailable(fmt.Errorf("kafka transactions not recovered: %w", failure))
		case <-s.closed:
			return errClosed
		}
	}
}

// recover starts a new producer, fences the others of the transactional id,
// reads every slot and opens the first transaction. The committer calls it
// while no transaction is open. Its errors are classified
// fault.Unavailable, but for a progress topic that cannot be used.
func (x *txns) recover() error {
	ctx, cancel := x.ctx(recoverTimeout)
	defer cancel()
	x.recovering.Store(true)
	defer x.recovering.Store(false)
	x.gate.Lock()
	defer x.gate.Unlock()
	x.mu.Lock()
	old := x.cl
	x.cl = nil
	x.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if _, err := x.s.EnsureProgressTopic(ctx); err != nil {
		return err
	}
	if err := x.restart(ctx); err != nil {
		return fault.AsUnavailable(err)
	}
	return nil
}

// restart is recover once the progress topic is there. The caller holds
// the gate exclusively.
func (x *txns) restart(ctx context.Context) error {
	opts, err := x.s.clientOptions(x.id)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	x.mu.Lock()
	x.cl = cl
	x.mu.Unlock()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence earlier producers of transactional id %s: %w", x.id, err)
	}
	latest := map[int]progress{}
	if err := x.read(ctx, 0, func(slot int, p progress) { latest[slot] = p }); err != nil {
		return err
	}
	keep := x.unarchivedOf(ctx, latest)
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.slots, x.where = [progressSlots]map[string]bool{}, map[string]int{}
	for slot, p := range latest {
		x.slots[slot] = map[string]bool{}
		for _, id := range p.IDs {
			if keep == nil || keep[id] {
				x.slots[slot][id], x.where[id] = true, slot
			}
		}
	}
	x.cur = x.newTxn(cl)
	x.s.opts.Logger.Info("kafka: transactions ready", "transactional_id", x.id, "progress_topic", ProgressTopic,
		"published_unarchived", len(x.where))
	return nil
}

// unarchivedOf returns which ids of the progress records latest still have
// an unarchived row, or nil (keep them all) when that cannot be told now.
func (x *txns) unarchivedOf(ctx context.Context, latest map[int]progress) map[string]bool {
	x.mu.Lock()
	ask := x.unarchived
	x.mu.Unlock()
	var ids []string
	for _, p := range latest {
		ids = append(ids, p.IDs...)
	}
	if ask == nil || len(ids) == 0 {
		return nil
	}
	left, err := ask(ctx, ids)
	if err != nil {
		x.s.opts.Logger.Warn("kafka: cannot look up which recorded events are still in the outbox; keeping them all",
			"recorded", len(ids), "err", err)
		return nil
	}
	keep := make(map[string]bool, len(left))
	for _, id := range left {
		keep[id] = true
	}
	return keep
}

// EnsureProgressTopic creates the progress topic with progressConfigs when
// it is missing, and reports whether it did. An existing topic whose
// cleanup.policy is not compact alone is an error classified
// fault.Permanent, naming the fix: such a topic loses progress records.
// A policy that cannot be read (no DESCRIBE_CONFIGS) is logged.
func (s *Sink) EnsureProgressTopic(ctx context.Context) (bool, error) {
	configs := make(map[string]*string, len(progressConfigs))
	for k, v := range progressConfigs {
		configs[k] = &v
	}
	_, replication := s.creation()
	created, err := s.createWith(ctx, ProgressTopic, 1, replication, configs)
	if err != nil || created {
		return created, err
	}
	return false, s.checkProgressTopic(ctx)
}

// checkProgressTopic checks the cleanup.policy of the existing progress
// topic.
func (s *Sink) checkProgressTopic(ctx context.Context) error {
	rcs, err := s.adm.DescribeTopicConfigs(ctx, ProgressTopic)
	var rc kadm.ResourceConfig
	if err == nil {
		rc, err = rcs.On(ProgressTopic, nil)
	}
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		s.opts.Logger.Warn("kafka: cannot read the progress topic's cleanup.policy; it must be compact",
			"topic", ProgressTopic, "err", err)
		return nil
	}
	policy := "delete" // Kafka's default
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	if policy == "compact" {
		return nil
	}
	return fault.AsPermanent(fmt.Errorf("kafka topic %s has cleanup.policy=%s, which deletes the progress records "+
		"of sink.kafka.transactional (a restart would publish again what they record): set it with "+
		"kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact, "+
		"(and check that retention does not delete its records)", ProgressTopic, policy, ProgressTopic))
}

// read commits a marker and calls fn for every progress record of this
// transactional id from offset from up to the marker, in order.
func (x *txns) read(ctx context.Context, from int64, fn func(slot int, p progress)) error {
	marker, err := x.mark(ctx)
	if err != nil {
		return err
	}
	opts, err := x.s.connOptions()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{ProgressTopic: {0: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	prefix := x.id + "/"
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var errs []error
		fs.EachError(func(_ string, _ int32, err error) { errs = append(errs, err) })
		if len(errs) > 0 {
			return fmt.Errorf("read %s: %w", ProgressTopic, errors.Join(errs...))
		}
		for _, r := range fs.Records() {
			if r.Offset >= marker {
				return nil
			}
			slot, err := strconv.Atoi(strings.TrimPrefix(string(r.Key), prefix))
			if !strings.HasPrefix(string(r.Key), prefix) || err != nil || slot < 0 || slot >= progressSlots {
				continue
			}
			var p progress
			if json.Unmarshal(r.Value, &p) == nil {
				fn(slot, p)
			}
		}
	}
}

// mark commits a transaction holding only a marker record and returns its
// offset: a read_committed consumer that reached it has seen every
// transaction of this id committed before. The caller is the committer,
// holding the gate.
func (x *txns) mark(ctx context.Context) (int64, error) {
	cl := x.producer()
	if err := cl.BeginTransaction(); err != nil {
		return 0, fmt.Errorf("begin transaction: %w", err)
	}
	r := &kgo.Record{Topic: ProgressTopic, Key: []byte(x.id + "/marker"), Value: []byte(x.run)}
	res := cl.ProduceSync(ctx, r)
	err := res.FirstErr()
	commit := kgo.TryCommit
	if err != nil {
		commit = kgo.TryAbort
	}
	if endErr := cl.EndTransaction(ctx, commit); err == nil && endErr != nil {
		err = endErr
	}
	if err != nil {
		return 0, fmt.Errorf("commit a marker to %s: %w", ProgressTopic, err)
	}
	return r.Offset, nil
}

// producer returns the current transactional producer.
func (x *txns) producer() *kgo.Client {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cl
}

// commit ends the open transaction whenever it holds records, and recovers
// when asked while none is open, until the sink closes.
func (x *txns) commit() {
	defer close(x.exited)
	delay := time.Duration(0)
	for {
		select {
		case <-x.s.closed:
			x.shutdown()
			return
		case <-x.kick:
		}
		x.mu.Lock()
		t := x.cur
		x.mu.Unlock()
		if t == nil {
			delay = x.retry(delay)
			continue
		}
		x.gate.Lock()
		if t.produced == 0 {
			x.gate.Unlock()
			continue
		}
		err := x.end(t)
		next := x.begin(t.cl, err)
		x.mu.Lock()
		x.cur = next
		x.mu.Unlock()
		x.gate.Unlock()
		t.finish(err)
	}
}

// retry recovers once, after waiting delay, the wait after the previous
// failed attempt, and returns the wait before the next attempt.
func (x *txns) retry(delay time.Duration) time.Duration {
	select {
	case <-time.After(delay):
	case <-x.s.closed:
		return delay
	}
	err := x.recover()
	x.mu.Lock()
	x.failure = err
	close(x.changed)
	x.changed = make(chan struct{})
	x.mu.Unlock()
	if err == nil {
		x.fails.OK()
		return 0
	}
	x.fails.Fail(fmt.Errorf("transactional id %s: %w", x.id, err))
	return min(max(2*delay, 100*time.Millisecond), 5*time.Second)
}

// shutdown fails the open transaction and closes the producer.
func (x *txns) shutdown() {
	x.mu.Lock()
	cur, cl := x.cur, x.cl
	x.cur = nil
	x.mu.Unlock()
	if cur != nil {
		cur.finish(errClosed)
	}
	if cl != nil {
		cl.Close()
	}
}

// stop waits for the committer to return after the sink closed.
func (x *txns) stop() {
	x.once.Do(func() { close(x.exited) })
	<-x.exited
}

// errNoTxn fails publishes while no transaction is open.
var errNoTxn = fault.AsUnavailable(errors.New("no kafka transaction open: the transactional producer is being recovered"))

// begin opens the next transaction on cl after one that ended with err,
// aborting what cl still holds open after a failure. It returns nil when
// cl cannot go on: it was fenced, or no transaction begins; the next
// publish then starts a new producer (recover).
func (x *txns) begin(cl *kgo.Client, err error) *txn {
	if fenced(err) {
		x.s.opts.Logger.Warn("kafka: the transactional producer was fenced (another relay used the transactional id); "+
			"a new one is started and recovered before the next publish", "transactional_id", x.id, "err", err)
		return nil
	}
	err = cl.BeginTransaction()
	if err != nil {
		x.abort()
		err = cl.BeginTransaction()
	}
	if err != nil {
		x.s.opts.Logger.Warn("kafka: cannot begin a transaction (fenced by another relay with the same transactional id?); "+
			"a new producer is started and recovered before the next publish", "transactional_id", x.id, "err", err)
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.newTxn(cl)
}

// fenced reports whether err says another producer took over the
// transactional id, or the broker no longer knows this producer's epoch:
// the producer can never commit again.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping)
}

// ctx returns a context that ends when the sink closes or, when d > 0,
// after d.
func (x *txns) ctx(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.CancelFunc(func() {})
	if d > 0 {
		ctx, stop = context.WithTimeout(ctx, d)
	}
	go func() {
		select {
		case <-x.s.closed:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, func() { stop(); cancel() }
}

// end writes t's progress record and commits t, returning nil when it
// committed. The caller holds the gate exclusively.
func (x *txns) end(t *txn) error {
	ctx, cancel := x.ctx(x.s.opts.AckTimeout)
	defer cancel()
	if err := t.cl.Flush(ctx); err != nil {
		x.abort()
		return fault.AsUnavailable(fmt.Errorf("flush transaction: %w", err))
	}
	for {
		t.mu.Lock()
		all := t.settled == t.produced
		t.mu.Unlock()
		if all {
			break
		}
		select {
		case <-t.settle:
		case <-ctx.Done():
			x.abort()
			return fault.AsUnavailable(fmt.Errorf("records of the transaction not settled: %w", ctx.Err()))
		}
	}
	if len(t.acked) == 0 {
		x.abort()
		return fault.AsUnavailable(fmt.Errorf("no record of the transaction was appended: %w", t.failed))
	}
	slot := int(t.seq % progressSlots)
	carried := x.carried(slot)
	value, _ := json.Marshal(progress{Run: x.run, Txn: t.seq, IDs: append(slices.Clip(t.acked), carried...)})
	rec := &kgo.Record{Topic: ProgressTopic, Key: []byte(x.id + "/" + strconv.Itoa(slot)), Value: value}
	if err := t.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		x.abort()
		return fault.AsUnavailable(fmt.Errorf("record progress in %s: %w", ProgressTopic, err))
	}
	err := t.cl.EndTransaction(ctx, kgo.TryCommit)
	if err != nil {
		x.s.opts.Logger.Warn("kafka: transaction commit failed; reading its outcome back", "transactional_id", x.id, "err", err)
		rctx, cancel := x.ctx(0)
		defer cancel()
		committed, rerr := x.resolve(rctx, rec)
		if rerr != nil {
			return rerr
		}
		if !committed {
			return fault.AsUnavailable(fmt.Errorf("transaction aborted: %w", err))
		}
	}
	x.committed(slot, t.acked, carried)
	return nil
}

// abort aborts the open transaction; its records are never visible to
// read_committed consumers.
func (x *txns) abort() {
	ctx, cancel := x.ctx(x.s.opts.AckTimeout)
	defer cancel()
	if err := x.producer().EndTransaction(ctx, kgo.TryAbort); err != nil {
		x.s.opts.Logger.Warn("kafka: transaction abort failed", "transactional_id", x.id, "err", err)
	}
}

// resolve finds out whether the transaction holding the progress record
// rec committed: it aborts what is still open (which fences and bumps the
// epoch), then reads the progress topic from rec's offset. It retries until
// the sink closes, or gives up when another producer fenced this one.
func (x *txns) resolve(ctx context.Context, rec *kgo.Record) (bool, error) {
	fails := outage.New(x.s.opts.Logger, "kafka: reading a transaction's outcome failed; retrying", "kafka: read the transaction's outcome")
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		x.abort()
		found := false
		err := x.read(ctx, rec.Offset, func(_ int, p progress) {
			found = found || sameTxn(rec.Value, p)
		})
		if err == nil {
			fails.OK()
			return found, nil
		}
		if fenced(err) {
			return false, fault.AsUnavailable(fmt.Errorf("transaction outcome unknown, and the producer was fenced: %w", err))
		}
		fails.Fail(err)
		if err := wait.Sleep(ctx, delay); err != nil {
			return false, fault.AsUnavailable(fmt.Errorf("transaction outcome unknown: %w", err))
		}
	}
}

// sameTxn reports whether the progress value v is p's transaction.
func sameTxn(v []byte, p progress) bool {
	var q progress
	return json.Unmarshal(v, &q) == nil && q.Run == p.Run && q.Txn == p.Txn
}

// carried returns the unarchived ids an earlier transaction recorded in
// slot.
func (x *txns) carried(slot int) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]string, 0, len(x.slots[slot]))
	for id := range x.slots[slot] {
		out = append(out, id)
	}
	return out
}

// committed makes acked and those of carried not archived meanwhile the
// unarchived content of slot.
func (x *txns) committed(slot int, acked, carried []string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m := make(map[string]bool, len(acked)+len(carried))
	for _, id := range carried {
		if _, ok := x.where[id]; ok {
			m[id] = true
		}
	}
	for _, id := range acked {
		if old, ok := x.where[id]; ok && old != slot {
			delete(x.slots[old], id)
		}
		m[id], x.where[id] = true, slot
	}
	x.slots[slot] = m
}

// Recorded reports, for each of ids, whether a committed transaction of
// this or an earlier run holds its event and its row was not reported
// archived since: such an event is published and must not be sent again.
// Recover must have returned first. Safe for concurrent use.
func (s *Sink) Recorded(ids []string) []bool {
	out := make([]bool, len(ids))
	if s.txn == nil {
		return out
	}
	s.txn.mu.Lock()
	defer s.txn.mu.Unlock()
	for i, id := range ids {
		_, out[i] = s.txn.where[id]
	}
	return out
}

// Archived tells the sink that the rows of ids left the outbox, so the
// next progress records need not name them. Safe for concurrent use.
func (s *Sink) Archived(ids []string) {
	if s.txn == nil {
		return
	}
	s.txn.mu.Lock()
	defer s.txn.mu.Unlock()
	for _, id := range ids {
		if slot, ok := s.txn.where[id]; ok {
			delete(s.txn.slots[slot], id)
			delete(s.txn.where, id)
		}
	}
}

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
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/wait"
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
// row may still be in the outbox. A restarted relay fences its
// predecessor (the transactional id), reads those records (Recover) and
// archives such rows without publishing them again (Recorded).
//
// A commit whose outcome is unknown (an error from EndTransaction) is
// resolved from Kafka: the producer is fenced, a marker is committed, and
// the progress topic is read up to it; the transaction committed exactly
// when its progress record is there. Until then its publishes wait.

// progressSlots is how many keys of the progress topic a relay writes in
// turn; Recover reads the latest record of each.
const progressSlots = 64

// ProgressTopic is the progress topic of transactional sinks: compacted,
// one partition, created when missing.
const ProgressTopic = "_outbox_relay_progress"

// progress is the value of a progress record.
type progress struct {
	Run string   `json:"run"` // the writing process, a UUID
	Txn int64    `json:"txn"` // the transaction's number in that process
	IDs []string `json:"ids"`
}

// txns coordinates the transactions of a sink. Publish calls enter and
// leave the open transaction; the commit goroutine owns the producer's
// transaction state.
type txns struct {
	s    *Sink
	id   string // the transactional id
	run  string // this process, in progress records
	kick chan struct{}
	gate sync.RWMutex // held shared while producing, exclusively to end a transaction

	mu    sync.Mutex
	cur   *txn
	seq   int64
	slots [progressSlots]map[string]bool // ids published in committed transactions and not archived
	where map[string]int                 // id -> its slot

	once    sync.Once
	started chan struct{} // closed once Recover succeeded
}

// txn is one Kafka transaction.
type txn struct {
	seq      int64
	mu       sync.Mutex
	produced int
	settled  int
	acked    []string // ids of the records the broker appended
	settle   chan struct{}
	done     chan struct{} // closed once err is final
	err      error         // nil when committed
}

func newTxns(s *Sink) *txns {
	return &txns{s: s, id: s.cfg.TransactionalID, run: uuid.NewString(), kick: make(chan struct{}, 1),
		where: map[string]int{}, started: make(chan struct{})}
}

func (x *txns) newTxn() *txn {
	x.seq++
	return &txn{seq: x.seq, settle: make(chan struct{}, 1), done: make(chan struct{})}
}

// enter returns the open transaction, holding it open until leave.
func (x *txns) enter() *txn {
	x.gate.RLock()
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cur
}

// leave lets the open transaction end and wakes the committer.
func (x *txns) leave() {
	x.gate.RUnlock()
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

// Recover fences earlier producers of the transactional id, reads the
// progress topic and starts the committer. It is called once, before the
// first Publish, by the relay that is about to publish (a standby must not
// fence the active relay); later calls return nil at once. It retries
// until ctx ends.
func (s *Sink) Recover(ctx context.Context) error {
	x := s.txn
	if x == nil {
		return nil
	}
	select {
	case <-x.started:
		return nil
	default:
	}
	fails := outage.New(s.opts.Logger, "kafka: reading the transactions' progress failed; retrying", "kafka: read the transactions' progress")
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		err := x.recover(ctx)
		if err == nil {
			fails.OK()
			break
		}
		if ctx.Err() != nil {
			return err
		}
		fails.Fail(err)
		if err := wait.Sleep(ctx, delay); err != nil {
			return err
		}
	}
	x.once.Do(func() {
		close(x.started)
		go x.commit()
	})
	return nil
}

// recover fences, reads every slot and opens the first transaction.
func (x *txns) recover(ctx context.Context) error {
	if _, err := x.s.EnsureProgressTopic(ctx); err != nil {
		return err
	}
	if _, _, err := x.s.cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence earlier producers of transactional id %s: %w", x.id, err)
	}
	latest := map[int]progress{}
	err := x.read(ctx, 0, func(slot int, p progress) { latest[slot] = p })
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for slot, p := range latest {
		x.slots[slot] = map[string]bool{}
		for _, id := range p.IDs {
			x.slots[slot][id], x.where[id] = true, slot
		}
		n += len(p.IDs)
	}
	if err := x.s.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	x.cur = x.newTxn()
	x.s.opts.Logger.Info("kafka: transactions ready", "transactional_id", x.id, "progress_topic", ProgressTopic,
		"published_unarchived", n)
	return nil
}

// EnsureProgressTopic creates the progress topic, compacted with one
// partition, when it is missing, and reports whether it did.
func (s *Sink) EnsureProgressTopic(ctx context.Context) (bool, error) {
	compact := "compact"
	_, replication := s.creation()
	return s.createWith(ctx, ProgressTopic, 1, replication, map[string]*string{"cleanup.policy": &compact})
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
// transaction of this id committed before. The caller holds the gate or
// runs before the committer starts.
func (x *txns) mark(ctx context.Context) (int64, error) {
	if err := x.s.cl.BeginTransaction(); err != nil {
		return 0, fmt.Errorf("begin transaction: %w", err)
	}
	r := &kgo.Record{Topic: ProgressTopic, Key: []byte(x.id + "/marker"), Value: []byte(x.run)}
	res := x.s.cl.ProduceSync(ctx, r)
	err := res.FirstErr()
	commit := kgo.TryCommit
	if err != nil {
		commit = kgo.TryAbort
	}
	if endErr := x.s.cl.EndTransaction(ctx, commit); err == nil && endErr != nil {
		err = endErr
	}
	if err != nil {
		return 0, fmt.Errorf("commit a marker to %s: %w", ProgressTopic, err)
	}
	return r.Offset, nil
}

// commit ends the open transaction whenever it holds records, until the
// sink closes.
func (x *txns) commit() {
	open := true
	for {
		select {
		case <-x.s.closed:
			x.mu.Lock()
			cur := x.cur
			x.mu.Unlock()
			cur.finish(errClosed)
			return
		case <-x.kick:
		}
		x.gate.Lock()
		x.mu.Lock()
		t := x.cur
		x.mu.Unlock()
		if t.produced == 0 {
			x.gate.Unlock()
			continue
		}
		err := errNoTxn
		if open {
			err = x.end(t)
		}
		open = x.begin()
		x.mu.Lock()
		x.cur = x.newTxn()
		x.mu.Unlock()
		x.gate.Unlock()
		t.finish(err)
	}
}

// errNoTxn fails the publishes of a transaction that could not begin.
var errNoTxn = fault.AsUnavailable(errors.New("no kafka transaction open (the last one could not end or begin)"))

// begin opens the next transaction, aborting what the client still holds
// open after a failure, and reports whether it is open.
func (x *txns) begin() bool {
	err := x.s.cl.BeginTransaction()
	if err != nil {
		x.abort()
		err = x.s.cl.BeginTransaction()
	}
	if err != nil {
		x.s.opts.Logger.Error("kafka: cannot begin a transaction (fenced by another relay with the same transactional id?)",
			"transactional_id", x.id, "err", err)
		return false
	}
	return true
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
	if err := x.s.cl.Flush(ctx); err != nil {
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
		return fault.AsUnavailable(errors.New("no record of the transaction was appended"))
	}
	slot := int(t.seq % progressSlots)
	carried := x.carried(slot)
	value, _ := json.Marshal(progress{Run: x.run, Txn: t.seq, IDs: append(slices.Clip(t.acked), carried...)})
	rec := &kgo.Record{Topic: ProgressTopic, Key: []byte(x.id + "/" + strconv.Itoa(slot)), Value: value}
	if err := x.s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		x.abort()
		return fault.AsUnavailable(fmt.Errorf("record progress in %s: %w", ProgressTopic, err))
	}
	err := x.s.cl.EndTransaction(ctx, kgo.TryCommit)
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
	if err := x.s.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		x.s.opts.Logger.Warn("kafka: transaction abort failed", "transactional_id", x.id, "err", err)
	}
}

// resolve finds out whether the transaction holding the progress record
// rec committed: it aborts what is still open (which fences and bumps the
// epoch), then reads the progress topic from rec's offset. It retries until
// the sink closes.
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

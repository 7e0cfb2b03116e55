package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// stream is one replication connection, from START_REPLICATION until it
// breaks or the source closes. Its goroutine (run) owns the connection and
// the decoder: it receives messages, fills the open batch and sends standby
// status updates. Next takes batches from it; batches are archived from
// other goroutines. Fields below mu are shared and guarded by it.
type stream struct {
	src   *Source
	conn  *pgconn.PgConn
	dec   *decoder
	every time.Duration // between standby status updates
	log   *slog.Logger

	ready    chan struct{} // signalled when the open batch can be taken
	taken    chan struct{} // signalled when a full open batch was taken
	done     chan struct{} // closed when run returned; err is set then
	err      error
	stop     context.CancelCauseFunc // ends run, e.g. after a failed archive
	life     context.Context         // run's context: once it ends, no batch is handed out
	sent     pglogrepl.LSN           // the position of the last status update; run's only
	replayTo pglogrepl.LSN           // the server's WAL position when the stream started; see replay.go
	deadline time.Time               // the socket's read deadline; run's only
	poked    atomic.Bool             // archived moved the confirmed position; see poke

	mu              sync.Mutex
	open            *batch // being filled by run
	atCommit        bool   // the open batch's last row's transaction has committed
	inflight        []*batch
	flushed         pglogrepl.LSN // the position confirmed to the server
	unarchived      int           // rows of handed-out batches not archived yet
	unarchivedBytes int           // their bytes (event.Event.Size)
}

// maxUnarchivedBatches bounds the rows handed out and not yet archived, in
// full batches. The pipeline's window only counts unpublished events; this
// bound also holds memory while archiving lags behind publishing (with
// large payloads the stream otherwise ran far past the window). It counts
// rows, not batches, so that a stream of small transactions is not held
// back by the number of its batches.
const maxUnarchivedBatches = 24

// unarchivedBatchBytes bounds the bytes (event.Event.Size) of the rows
// handed out and not yet archived, in Options.MaxBatchBytes, so large
// payloads do not hold hundreds of MB.
const unarchivedBatchBytes = 3

func newStream(src *Source, conn *pgconn.PgConn, start, replayTo pglogrepl.LSN, every time.Duration) *stream {
	dec := newDecoder(src.layout, src.info.Missing)
	dec.prefix = src.opts.MessagePrefix
	st := &stream{src: src, conn: conn, dec: dec, every: every, log: src.log,
		ready: make(chan struct{}, 1), taken: make(chan struct{}, 1), done: make(chan struct{}), flushed: start,
		replayTo: replayTo}
	st.open = st.newBatch()
	return st
}

// newBatch returns an empty batch with room for about as many rows as
// the last one had: a batch per small transaction should not allocate
// room for BatchSize rows.
func (st *stream) newBatch() *batch {
	n := st.src.opts.BatchSize
	if st.open != nil {
		n = min(n, max(2*st.open.rows(), 8))
	}
	return &batch{src: st.src, st: st, events: make([]*event.Event, 0, n), seqs: make([]int64, 0, n)}
}

// next returns the next batch of the stream, waiting for one, without the
// replayed events an earlier run archived (see replay.go). It fails when
// the stream ended; a failed look-up ends the stream.
//
// Once the stream is stopped it hands out nothing more, not even a batch
// it received before: after Release (see Source.Release) the rows the
// drain publishes must come before any newer row of the released
// aggregates, and the open batch may hold such rows, received while they
// were held. The pipeline lifts a released aggregate's park at the first
// batch of a Next called after Release returned, so such a batch must not
// come from this stream. Its rows are streamed again from the slot's
// confirmed position after the drain.
func (st *stream) next(ctx context.Context) (capture.Batch, error) {
	for {
		if st.life.Err() != nil {
			select {
			case <-st.done:
				return nil, st.err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		b := st.take()
		if b != nil && st.src.opts.MessagePrefix == "" && len(st.src.info.Missing) == 0 && !st.src.opts.ring() && st.replayed(b) {
			left, err := st.dropArchived(ctx, b)
			if err != nil {
				st.fail(err)
				return nil, err
			}
			if !left {
				st.archived(b)
				continue
			}
		}
		if b != nil {
			b.leaveHeld()
			return b, nil
		}
		select {
		case <-st.ready:
		case <-st.done:
			return nil, st.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// take hands out the open batch when it is full, or ends at a commit;
// otherwise it returns nil.
func (st *stream) take() *batch {
	st.mu.Lock()
	defer st.mu.Unlock()
	b := st.open
	full := st.isFull(b)
	if b.rows() == 0 || !(full || st.atCommit) ||
		st.unarchived >= maxUnarchivedBatches*st.src.opts.BatchSize || st.unarchivedBytes >= unarchivedBatchBytes*st.src.opts.MaxBatchBytes {
		return nil
	}
	b.n = b.rows()
	st.unarchived += b.n
	st.unarchivedBytes += b.bytes
	st.inflight = append(st.inflight, b)
	st.open, st.atCommit = st.newBatch(), false
	if full {
		signal(st.taken)
	}
	return b
}

// archived marks b archived and moves the confirmed position to the ack of
// the longest archived prefix of the handed-out batches.
func (st *stream) archived(b *batch) {
	st.mu.Lock()
	defer st.mu.Unlock()
	b.done = true
	b.events, b.seqs, b.bad = nil, nil, nil // only its ack matters now
	st.unarchived -= b.n
	st.unarchivedBytes -= b.bytes
	signal(st.ready)
	i, was := 0, st.flushed
	for ; i < len(st.inflight) && st.inflight[i].done; i++ {
		st.flushed = max(st.flushed, st.inflight[i].ack)
	}
	clear(st.inflight[:i])
	st.inflight = st.inflight[i:]
	if st.flushed != was {
		st.poke()
	}
}

// poke interrupts run's read, so that it reports a confirmed position
// archived moved without a timer of its own. It sets poked before the
// deadline and receive checks it after setting its own, so no poke is
// lost.
func (st *stream) poke() {
	st.poked.Store(true)
	st.conn.Conn().SetReadDeadline(time.Now())
}

// fail ends the stream; Next then reconnects from the confirmed position.
func (st *stream) fail(err error) { st.stop(err) }

// add appends a decoded row to the open batch and reports whether it is
// full.
func (st *stream) add(d decoded) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	b := st.open
	if n := len(b.xids); n == 0 || b.xids[n-1] != d.xid {
		b.xids = append(b.xids, d.xid)
	}
	b.add(d)
	st.atCommit = false
	full := st.isFull(b)
	if full {
		signal(st.ready)
	}
	return full
}

// add appends a decoded row's event or bad row.
func (b *batch) add(d decoded) {
	if d.ev != nil {
		b.bytes += d.ev.Size()
		b.events = append(b.events, d.ev)
		b.seqs = append(b.seqs, d.seq)
		if d.stored != "" {
			if b.stored == nil {
				b.stored = make(map[*event.Event]string)
			}
			b.stored[d.ev] = d.stored
		}
	} else {
		b.bytes += d.bad.size()
		b.bad = append(b.bad, d.bad)
	}
}

// commit records the end of a transaction: the open batch, or when it is
// empty the last handed-out batch, may confirm it once archived; with
// nothing in flight it is confirmed at once.
func (st *stream) commit(end pglogrepl.LSN) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.open.rows() > 0:
		st.open.ack, st.atCommit = end, true
	case len(st.inflight) > 0:
		st.inflight[len(st.inflight)-1].ack = end
	default:
		st.flushed = max(st.flushed, end)
	}
}

// caughtUp hands out the open batch when it ends at a commit: run handled
// every message received so far (see pacedReader), so the batch holds every
// transaction that arrived with the last read from the socket.
func (st *stream) caughtUp() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.atCommit {
		signal(st.ready)
	}
}

// idle confirms the server's WAL end when no row is in flight and no
// transaction is half received, so an idle outbox does not hold WAL back.
func (st *stream) idle(walEnd pglogrepl.LSN) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.open.rows() == 0 && len(st.inflight) == 0 {
		st.flushed = max(st.flushed, walEnd)
	}
}

// nothingInFlight reports whether no row is in flight and no transaction
// is half received; run's only (it reads the decoder).
func (st *stream) nothingInFlight() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return !st.dec.inTx && st.open.rows() == 0 && len(st.inflight) == 0
}

func (st *stream) full() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.isFull(st.open)
}

// isFull reports whether b holds Options.BatchSize rows or
// Options.MaxBatchBytes bytes; st.mu is held.
func (st *stream) isFull(b *batch) bool {
	return b.rows() >= st.src.opts.BatchSize || b.bytes >= st.src.opts.MaxBatchBytes
}

func (st *stream) position() pglogrepl.LSN {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.flushed
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// run owns the connection until ctx ends or the stream fails. On the way
// out it sends a last status update, closes the connection and sets err.
func (st *stream) run(ctx context.Context) {
	interrupt := context.AfterFunc(ctx, func() { st.conn.Conn().SetReadDeadline(time.Now()) })
	err := st.loop(ctx)
	interrupt()
	if cause := context.Cause(ctx); cause != nil {
		err = cause
	}
	if st.sendStatus(false) == nil {
		st.log.Debug("replication stream stopped", "lsn", st.position().String())
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st.conn.Close(cctx)
	cancel()
	st.err = fmt.Errorf("replication stream ended: %w", err)
	close(st.done)
}

// loop receives messages, waiting at most until the next status update is
// due. A moved confirmed position is reported at most every ackDelay: an
// archive interrupts the read (poke), and a position moved less than
// ackDelay after the last update waits for the read's deadline then. The
// server's requests for a reply are answered at once. While the open batch
// is full it does not read, so the server stops sending, but it keeps
// sending status updates on time.
func (st *stream) loop(ctx context.Context) error {
	due := time.Now().Add(st.every)
	var sentAt time.Time
	for {
		if st.full() {
			if err := st.waitTaken(ctx, &due); err != nil {
				return err
			}
			continue
		}
		wait := due
		if at := sentAt.Add(ackDelay); st.position() != st.sent && at.Before(due) {
			wait = at
		}
		reply, err := st.receive(ctx, wait)
		if err != nil {
			return err
		}
		now := time.Now()
		moved := st.position() != st.sent && now.Sub(sentAt) >= ackDelay
		periodic := !now.Before(due)
		if reply || moved || periodic {
			if err := st.sendStatus(periodic && st.nothingInFlight()); err != nil {
				return err
			}
			sentAt, due = now, now.Add(st.every)
		}
	}
}

// ackDelay is the least time between status updates that report a moved
// confirmed position: an archived position is confirmed within about two
// of them, so a crash replays little, while a stream of small transactions
// does not send the server a status update per archive.
const ackDelay = 20 * time.Millisecond

// receive handles the next message, or returns when due passes or after a
// poke. It reports whether the server asked for a reply. The wait is a
// read deadline on the socket, set only when due moves, not a context per
// message: a stream of small transactions is thousands of messages a
// second. run moves the deadline to now when ctx ends.
func (st *stream) receive(ctx context.Context, due time.Time) (bool, error) {
	if st.poked.Swap(false) {
		st.deadline = time.Time{} // the poke's
		return false, nil
	}
	if !due.Equal(st.deadline) {
		if err := st.conn.Conn().SetReadDeadline(due); err != nil {
			return false, fmt.Errorf("receive: %w", err)
		}
		st.deadline = due
	}
	if err := ctx.Err(); err != nil || st.poked.Load() {
		return false, err
	}
	msg, err := st.conn.ReceiveMessage(context.Background())
	switch {
	case ctx.Err() != nil:
		return false, ctx.Err()
	case err != nil && pgconn.Timeout(err):
		return false, nil // a status update is due
	case err != nil:
		return false, fmt.Errorf("receive: %w", err)
	}
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		return st.handle(m.Data)
	case *pgproto3.ErrorResponse:
		return false, pgconn.ErrorResponseToPgError(m)
	case *pgproto3.CopyDone:
		return false, errors.New("the server ended the replication stream")
	}
	return false, nil
}

// handle processes one CopyData message of the replication protocol.
func (st *stream) handle(data []byte) (bool, error) {
	if len(data) == 0 {
		return false, fmt.Errorf("%w: empty CopyData", errProtocol)
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, fmt.Errorf("%w: %v", errProtocol, err)
		}
		if !st.dec.inTx {
			st.idle(k.ServerWALEnd)
		}
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, fmt.Errorf("%w: %v", errProtocol, err)
		}
		d, err := st.dec.decode(x.WALData)
		if err != nil {
			return false, err
		}
		switch d.kind {
		case kindRow:
			if d.bad != nil {
				st.logBad(d.bad)
			}
			st.add(d)
		case kindCommit:
			st.commit(d.end)
		}
	}
	return false, nil
}

// logBad reports a row or message that goes to the dead-letter table once
// archived.
func (st *stream) logBad(r *badRow) {
	id := ""
	if r.vals[fID] != nil {
		id = *r.vals[fID]
	}
	st.log.Error("bad outbox row, moved to the dead-letter table when archived",
		"message_id", rowtext.Value(id), "lsn", st.dec.commit.String(), "err", rowtext.Error(r.err))
}

// waitTaken waits until Next takes the full open batch, sending status
// updates when due.
func (st *stream) waitTaken(ctx context.Context, due *time.Time) error {
	t := time.NewTimer(time.Until(*due))
	defer t.Stop()
	for st.full() {
		select {
		case <-st.taken:
		case <-t.C:
			if err := st.sendStatus(false); err != nil {
				return err
			}
			*due = time.Now().Add(st.every)
			t.Reset(st.every)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// sendStatus reports the confirmed position as written, flushed and
// applied. With askEnd the server is asked to reply: the loop asks on its
// periodic update when nothing is in flight, and the keepalive the server
// answers with carries its WAL end, which idle then confirms. The walsender
// sends such keepalives by itself only when it catches up, which a database
// that writes other tables without pause may never let it do.
func (st *stream) sendStatus(askEnd bool) error {
	pos := st.position()
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ReplyRequested: askEnd})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	st.sent = pos
	return nil
}

// statusEvery returns the interval between status updates: want, but at
// most a third of the connection's wal_sender_timeout so the server never
// times the connection out.
func statusEvery(ctx context.Context, conn *pgconn.PgConn, want time.Duration) (time.Duration, error) {
	res, err := conn.Exec(ctx, `SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'`).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return want, nil
	}
	ms, err := strconv.Atoi(string(res[0].Rows[0][0]))
	if err != nil || ms <= 0 {
		return want, nil
	}
	return max(min(want, time.Duration(ms)*time.Millisecond/3), 10*time.Millisecond), nil
}

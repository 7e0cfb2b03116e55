package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// decodeReader is the latency baseline: a minimal logical replication
// client reading the outbox's inserts from a temporary pgoutput slot of its
// own, in this process. It does what any pgoutput consumer must do and
// nothing more: it receives each message, takes the time, decodes the
// Insert, reads the row's id, and confirms what it received once a second
// and whenever the server asks, so its slot never holds WAL back. The slot
// is temporary: PostgreSQL drops it when the connection closes.
//
// For each insert of the current schedule (the receiver's), it records the
// receipt time in schedule.readAt.
type decodeReader struct {
	conn  *pgconn.PgConn
	cur   *atomic.Pointer[schedule]
	idCol int // the id column's index in the outbox's relation message
	pos   pglogrepl.LSN
	got   atomic.Int64 // inserts received
	stop  context.CancelFunc
	done  chan struct{}
	err   error
}

// readerPublication is the reader's own publication (inserts on the
// outbox), so that it depends on nothing the relay creates.
const readerPublication = "bench_reader"

// startDecodeReader creates d's reader publication when missing, a
// temporary slot, and starts streaming from it; receipts go to the
// schedule cur points to.
func startDecodeReader(ctx context.Context, d *database, cur *atomic.Pointer[schedule]) (*decodeReader, error) {
	var exists bool
	if err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, readerPublication).Scan(&exists); err != nil {
		return nil, err
	}
	if !exists {
		if err := d.exec(ctx, `CREATE PUBLICATION `+readerPublication+` FOR TABLE outbox WITH (publish = 'insert')`); err != nil {
			return nil, err
		}
	}
	cfg, err := pgconn.ParseConfig(d.dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "relaybench-reader"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("reader: connect: %w", err)
	}
	slot, err := pglogrepl.CreateReplicationSlot(ctx, conn, "bench_reader_"+d.name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("reader: create slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	err = pglogrepl.StartReplication(ctx, conn, slot.SlotName, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + readerPublication + "'"}})
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("reader: start replication: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &decodeReader{conn: conn, cur: cur, idCol: -1, pos: start, stop: cancel, done: make(chan struct{})}
	go func() {
		r.err = r.run(rctx)
		close(r.done)
	}()
	return r, nil
}

// close stops the reader and closes its connection, which drops the slot.
func (r *decodeReader) close() error {
	r.stop()
	<-r.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.conn.Close(ctx)
	if errors.Is(r.err, context.Canceled) {
		return nil
	}
	return r.err
}

// run receives until ctx ends, with a read deadline on the socket (no
// context per message) that wakes it for its status update each second.
func (r *decodeReader) run(ctx context.Context) error {
	stopWatch := context.AfterFunc(ctx, func() { r.conn.Conn().SetReadDeadline(time.Now()) })
	defer stopWatch()
	due := time.Now().Add(time.Second)
	for {
		if err := r.conn.Conn().SetReadDeadline(due); err != nil {
			return err
		}
		msg, err := r.conn.ReceiveMessage(context.Background())
		now := time.Now().UnixNano()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && pgconn.Timeout(err):
		case err != nil:
			return fmt.Errorf("reader: receive: %w", err)
		}
		reply := false
		if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 0 {
			if reply, err = r.handle(cd.Data, now); err != nil {
				return err
			}
		} else if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			return fmt.Errorf("reader: %w", pgconn.ErrorResponseToPgError(e))
		}
		if reply || time.Now().After(due) {
			err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: r.pos, WALFlushPosition: r.pos, WALApplyPosition: r.pos})
			if err != nil {
				return fmt.Errorf("reader: status update: %w", err)
			}
			due = time.Now().Add(time.Second)
		}
	}
}

// handle processes one CopyData message received at now (Unix ns) and
// reports whether the server asked for a reply.
func (r *decodeReader) handle(data []byte, now int64) (bool, error) {
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return false, err
		}
		r.pos = max(r.pos, k.ServerWALEnd)
		return k.ReplyRequested, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return false, err
		}
		r.pos = max(r.pos, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return false, err
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			for i, c := range m.Columns {
				if c.Name == "id" {
					r.idCol = i
				}
			}
		case *pglogrepl.InsertMessage:
			if r.idCol < 0 || m.Tuple == nil || r.idCol >= len(m.Tuple.Columns) {
				return false, errors.New("reader: insert without an id column")
			}
			r.got.Add(1)
			r.record(string(m.Tuple.Columns[r.idCol].Data), now)
		}
	}
	return false, nil
}

// failed returns the error that ended the reader, or nil while it runs.
func (r *decodeReader) failed() error {
	select {
	case <-r.done:
		return fmt.Errorf("pgoutput reader stopped: %w", r.err)
	default:
		return nil
	}
}

// record notes the receipt of the event with message id id in the current
// schedule.
func (r *decodeReader) record(id string, now int64) {
	s := r.cur.Load()
	if s == nil || s.readAt == nil {
		return
	}
	tag, idx, ok := parseBenchID(id)
	if ok && tag == s.tag && idx >= 0 && idx < s.n {
		if s.readAt[idx].CompareAndSwap(0, now) {
			s.reads.Add(1)
		}
	}
}

package claim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/rowtext"
)

// The claim's columns, in schema.Columns.List order.
const (
	colID = iota
	colAggregateType
	colAggregateID
	colEventType
	colPayload
	colHeaders
	colCreatedAt
	colSeq
	colOrder // the outbox.order_by column as text, when it is not the aggregate id
	numCols
)

// scanner reads claimed rows. For the column types of the documented table
// (the id and the order column cast to text, text or varchar for the other
// strings, json or jsonb headers) it reads the strings and headers from the
// row's raw values, one string allocation per row; when created_at and seq
// arrive as binary timestamptz and bigint and the payload as json, jsonb,
// text, varchar or binary bytea, it reads them from the raw values too,
// and otherwise lets pgx decode them into fields it reuses; for any other
// types it scans every column with pgx. It takes the events and payload
// copies of the first path from blocks it allocates for several rows. A
// scanner serves one claim.
type scanner struct {
	fast       bool
	binHdr     bool // headers arrive as binary jsonb: a version byte, then the text
	raw        bool // payload, created_at and seq can be read by decode
	binPayload bool // the payload arrives as binary jsonb
	dest       []any
	payload    []byte
	created    pgtype.Timestamptz
	seq        int64
	buf        []byte
	events     []event.Event // the unused rest of the current block of events
	nextEvents int           // the size of the next block of events
	bytes      []byte        // the current block of payload bytes
}

// The blocks of events and payload bytes grow with the claim, so that a
// claim of a few rows holds about its own size and a full claim few blocks:
// the first block holds firstEvents events, the first block of payload bytes
// twice the first payload, and each next block twice its predecessor, up to
// eventBlock events and payloadBlock bytes. A payload larger than a quarter
// of payloadBlock gets its own copy.
const (
	firstEvents  = 4
	eventBlock   = 32
	payloadBlock = 16 << 10
)

// newScanner returns the scanner of rows, whose fields it inspects.
func newScanner(rows pgx.Rows) *scanner {
	sc := &scanner{}
	fds := rows.FieldDescriptions()
	sc.dest = []any{nil, nil, nil, nil, &sc.payload, nil, &sc.created, &sc.seq, nil}
	if len(fds) != numCols && len(fds) != colOrder {
		return sc
	}
	sc.dest = sc.dest[:len(fds)]
	sc.fast = true
	for i, f := range fds {
		if (i < colPayload || i == colOrder) && f.DataTypeOID != pgtype.TextOID && f.DataTypeOID != pgtype.VarcharOID {
			sc.fast = false
		}
	}
	switch h := fds[colHeaders]; {
	case h.DataTypeOID == pgtype.JSONBOID && h.Format == pgtype.BinaryFormatCode:
		sc.binHdr = true
	case h.DataTypeOID == pgtype.JSONBOID, h.DataTypeOID == pgtype.JSONOID:
	default:
		sc.fast = false
	}
	binary := func(f pgconn.FieldDescription, oid uint32) bool {
		return f.DataTypeOID == oid && f.Format == pgtype.BinaryFormatCode
	}
	sc.raw = sc.fast && binary(fds[colCreatedAt], pgtype.TimestamptzOID) && binary(fds[colSeq], pgtype.Int8OID)
	switch p := fds[colPayload]; {
	case binary(p, pgtype.JSONBOID):
		sc.binPayload = true
	case p.DataTypeOID == pgtype.JSONBOID, p.DataTypeOID == pgtype.JSONOID, p.DataTypeOID == pgtype.TextOID,
		p.DataTypeOID == pgtype.VarcharOID, binary(p, pgtype.ByteaOID):
	default:
		sc.raw = false
	}
	return sc
}

// scan reads one row into an event, or into bad when the row is malformed.
func (b *batch) scan(rows pgx.Rows, contentType string) error {
	if b.sc == nil {
		b.sc = newScanner(rows)
	}
	if !b.sc.fast {
		return b.scanAll(rows, contentType)
	}
	sc := b.sc
	raw := rows.RawValues()
	ev := sc.newEvent()
	ev.ContentType = contentType
	if !sc.raw || !sc.decode(ev, raw) {
		sc.payload = nil
		if err := rows.Scan(sc.dest...); err != nil {
			return err
		}
		ev.Payload, ev.Position = sc.payload, uint64(sc.seq)
		if sc.created.Valid {
			ev.CreatedAt = sc.created.Time
		}
	}
	err := sc.fill(ev, raw)
	if err == nil && ev.Payload == nil {
		err = fmt.Errorf("payload is NULL")
	}
	b.add(ev, int64(ev.Position), err)
	return nil
}

// The created_at values decode reads: microseconds since 2000-01-01 UTC
// from year 1 to 9999. pgx decodes the others (infinity, far dates).
var (
	minCreated = (time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix() - y2k.Unix()) * 1e6
	maxCreated = (time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() - y2k.Unix()) * 1e6
	y2k        = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// decode sets the event's payload, created_at and seq from the row's raw
// values, as pgx decodes them; it reports false, changing nothing, for a
// value it leaves to pgx.
func (sc *scanner) decode(ev *event.Event, raw [][]byte) bool {
	seq, created, payload := raw[colSeq], raw[colCreatedAt], raw[colPayload]
	if len(seq) != 8 || created != nil && len(created) != 8 {
		return false
	}
	var at time.Time
	if created != nil {
		us := int64(binary.BigEndian.Uint64(created))
		if us < minCreated || us >= maxCreated {
			return false
		}
		at = time.Unix(y2k.Unix()+us/1e6, us%1e6*1e3)
	}
	if sc.binPayload && payload != nil {
		if len(payload) == 0 || payload[0] != 1 {
			return false // pgx names the unknown jsonb version
		}
		payload = payload[1:]
	}
	if payload != nil {
		payload = sc.copy(payload)
	}
	ev.Payload, ev.CreatedAt, ev.Position = payload, at, binary.BigEndian.Uint64(seq)
	return true
}

// newEvent returns a zero event from the current block of events.
func (sc *scanner) newEvent() *event.Event {
	if len(sc.events) == 0 {
		n := max(sc.nextEvents, firstEvents)
		sc.events = make([]event.Event, n)
		sc.nextEvents = min(2*n, eventBlock)
	}
	ev := &sc.events[0]
	sc.events = sc.events[1:]
	return ev
}

// copy returns a copy of p from the current block of payload bytes; the
// copy is never nil, also when p is empty (an empty payload is not NULL),
// and appending to it never writes into the block.
func (sc *scanner) copy(p []byte) []byte {
	if len(p) == 0 {
		return []byte{}
	}
	if len(p) > payloadBlock/4 {
		return append(make([]byte, 0, len(p)), p...)
	}
	if len(sc.bytes)+len(p) > cap(sc.bytes) {
		sc.bytes = make([]byte, 0, min(max(2*cap(sc.bytes), 2*len(p)), payloadBlock))
	}
	start := len(sc.bytes)
	sc.bytes = append(sc.bytes, p...)
	return sc.bytes[start:len(sc.bytes):len(sc.bytes)]
}

// fill sets the event's strings and headers from the row's raw values.
func (sc *scanner) fill(ev *event.Event, raw [][]byte) error {
	id := raw[colID]
	u, err := uuid.ParseBytes(id)
	if id == nil || raw[colAggregateType] == nil || raw[colAggregateID] == nil || raw[colEventType] == nil || err != nil {
		// The error names the first problem, as fill does.
		str := func(v []byte) *string {
			if v == nil {
				return nil
			}
			s := string(v)
			return &s
		}
		return fill(ev, str(id), str(raw[colAggregateType]), str(raw[colAggregateID]), str(raw[colEventType]), nil, nil)
	}
	canonical := len(id) == 36 && bytes.IndexAny(id, "ABCDEF") < 0
	buf := sc.buf[:0]
	if canonical {
		buf = append(buf, id...)
	}
	var order []byte
	if len(raw) > colOrder {
		order = raw[colOrder]
	}
	for _, v := range [][]byte{raw[colAggregateType], raw[colAggregateID], raw[colEventType], order} {
		buf = append(buf, v...)
	}
	sc.buf = buf
	s := string(buf)
	i := 0
	cut := func(n int) string {
		t := s[i : i+n]
		i += n
		return t
	}
	if canonical {
		ev.ID = cut(36)
	} else {
		ev.ID = u.String()
	}
	ev.AggregateType = cut(len(raw[colAggregateType]))
	ev.AggregateID = cut(len(raw[colAggregateID]))
	ev.EventType = cut(len(raw[colEventType]))
	ev.OrderKey = cut(len(order))
	if h := raw[colHeaders]; h != nil {
		if sc.binHdr {
			if len(h) == 0 || h[0] != 1 {
				return fmt.Errorf("headers: unknown jsonb format version")
			}
			h = h[1:]
		}
		if ev.Headers, err = event.ParseHeaders(h); err != nil {
			return fmt.Errorf("headers must be a JSON object of strings: %v", err)
		}
	}
	return nil
}

// scanAll reads one row with a pgx scan of every column.
func (b *batch) scanAll(rows pgx.Rows, contentType string) error {
	var (
		id, aggType, aggID, evType, order *string
		payload, headers                  []byte
		created                           pgtype.Timestamptz // an infinite created_at is a zero time, as in scan
		seq                               int64
	)
	dst := []any{&id, &aggType, &aggID, &evType, &payload, &headers, &created, &seq, &order}
	if err := rows.Scan(dst[:len(rows.FieldDescriptions())]...); err != nil {
		return err
	}
	ev := &event.Event{Payload: payload, ContentType: contentType, Position: uint64(seq)}
	if order != nil {
		ev.OrderKey = *order
	}
	var at *time.Time
	if created.Valid {
		at = &created.Time
	}
	err := fill(ev, id, aggType, aggID, evType, headers, at)
	if err == nil && payload == nil {
		err = fmt.Errorf("payload is NULL")
	}
	b.add(ev, seq, err)
	return nil
}

// add records a scanned row: an event, or a bad row when err is set.
func (b *batch) add(ev *event.Event, seq int64, err error) {
	b.last = seq
	b.seqs = append(b.seqs, seq)
	b.bytes += ev.Size()
	if err != nil {
		now := time.Now().UnixNano()
		b.bad = append(b.bad, capture.DeadEvent{Event: ev, Err: "bad row: " + err.Error(), Class: "permanent",
			Attempts: 1, FirstFailed: now, LastFailed: now})
		b.s.log.Error("bad outbox row, moved to the dead-letter table", "seq", seq, "message_id", rowtext.Value(ev.ID),
			"err", rowtext.Error(err.Error()))
		return
	}
	b.events = append(b.events, ev)
}

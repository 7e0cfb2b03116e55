package wal

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
)

// The outbox fields, in schema.Columns.List order.
const (
	fID = iota
	fAggregateType
	fAggregateID
	fEventType
	fPayload
	fHeaders
	fCreatedAt
	fSeq
	fOrder // schema.Columns.OrderBy; its name is empty when not set
	numFields
)

// Type OIDs of the payload types pgoutput may announce.
const (
	oidBytea   = 17
	oidText    = 25
	oidJSON    = 114
	oidVarchar = 1043
	oidJSONB   = 3802
)

// errProtocol marks a message that does not follow the pgoutput protocol;
// the stream is restarted.
var errProtocol = errors.New("malformed pgoutput message")

// relation is what the decoder keeps of a Relation message.
type relation struct {
	outbox bool
	// field maps each column of the relation's tuples to the outbox field
	// it holds, or -1.
	field []int8
	// missing names a mapped column the relation lacks; its rows are bad.
	missing     string
	contentType string // from the payload column's type; empty when unsupported
	payloadType uint32
}

// kind says what a decoded message produced.
type kind int

const (
	kindNone   kind = iota // nothing for the relay (other tables, updates, ...)
	kindBegin              // a transaction starts
	kindRow                // an outbox insert: ev or bad is set
	kindCommit             // a transaction ends at end
)

// decoded is the result of one message.
type decoded struct {
	kind kind
	ev   *event.Event
	seq  int64
	// stored is the row's id as the table stores it when that is not the
	// canonical text of ev.ID (a text column holding an upper-case or
	// braced UUID); "" otherwise.
	stored string
	bad    *badRow
	end    pglogrepl.LSN
	xid    uint32 // the row's transaction
}

// badRow is an outbox insert that cannot become an event; it goes to the
// dead-letter table with the column values as received.
type badRow struct {
	vals [numFields]*string
	err  string
}

// decoder turns pgoutput (proto_version 1) messages into events. It keeps
// the relations announced on the stream and the transaction being received.
// It is used by one goroutine.
type decoder struct {
	table  schema.Table
	names  []string
	rels   map[uint32]*relation
	inTx   bool
	commit pglogrepl.LSN // commit LSN of the transaction being received
	// commitAt is the commit time of the transaction being received.
	commitAt time.Time
	// prefix is Options.MessagePrefix: when set, the decoder turns the
	// logical decoding messages with this prefix into events (see
	// message.go) and ignores the outbox table's inserts.
	prefix  string
	xid     uint32 // the transaction being received
	vals    [numFields][]byte
	scratch []byte
}

// newDecoder returns the decoder of l's outbox, which lacks the columns
// missing (see schema.Info.Missing).
func newDecoder(l schema.Layout, missing []string) *decoder {
	return &decoder{table: l.Outbox, names: fieldNames(l, missing), rels: map[uint32]*relation{}}
}

// fieldNames returns the column name of each field; it is empty for the
// fields of the missing columns, and fOrder's is empty when the aggregate
// id orders.
func fieldNames(l schema.Layout, missing []string) []string {
	names := make([]string, numFields)
	copy(names, l.Cols.List())
	for k, n := range names {
		if slices.Contains(missing, n) {
			names[k] = ""
		}
	}
	return names
}

// decode decodes one message of an XLogData record. The result does not
// refer to msg.
func (d *decoder) decode(msg []byte) (decoded, error) {
	if len(msg) == 0 {
		return decoded{}, fmt.Errorf("%w: empty", errProtocol)
	}
	body := msg[1:]
	switch pglogrepl.MessageType(msg[0]) {
	case pglogrepl.MessageTypeBegin:
		var m pglogrepl.BeginMessage
		if err := m.Decode(body); err != nil {
			return decoded{}, fmt.Errorf("%w: %v", errProtocol, err)
		}
		d.inTx, d.commit, d.commitAt, d.xid = true, m.FinalLSN, m.CommitTime, m.Xid
		return decoded{kind: kindBegin}, nil
	case pglogrepl.MessageTypeCommit:
		var m pglogrepl.CommitMessage
		if err := m.Decode(body); err != nil {
			return decoded{}, fmt.Errorf("%w: %v", errProtocol, err)
		}
		d.inTx = false
		return decoded{kind: kindCommit, end: m.TransactionEndLSN}, nil
	case pglogrepl.MessageTypeRelation:
		return decoded{}, d.relation(body)
	case pglogrepl.MessageTypeInsert:
		if d.prefix != "" {
			return decoded{}, nil
		}
		return d.insert(body)
	case pglogrepl.MessageTypeMessage:
		return d.message(body)
	}
	return decoded{}, nil // updates, deletes, truncates, types, origins
}

// relation records a Relation message. Relations can change mid-stream
// (ALTER TABLE); the latest message for an OID wins.
func (d *decoder) relation(body []byte) error {
	var m pglogrepl.RelationMessage
	if len(body) < 7 {
		return fmt.Errorf("%w: short relation message", errProtocol)
	}
	if err := m.Decode(body); err != nil {
		return fmt.Errorf("%w: %v", errProtocol, err)
	}
	rel := &relation{outbox: m.Namespace == d.table.Schema && m.RelationName == d.table.Name}
	d.rels[m.RelationID] = rel
	if !rel.outbox {
		return nil
	}
	rel.field = make([]int8, len(m.Columns))
	var found [numFields]bool
	for i, c := range m.Columns {
		rel.field[i] = -1
		for k, name := range d.names {
			if name == "" {
				found[k] = true
			} else if c.Name == name && !found[k] {
				rel.field[i], found[k] = int8(k), true
				if k == fPayload {
					rel.payloadType, rel.contentType = c.DataType, contentType(c.DataType)
				}
			}
		}
	}
	for k, ok := range found {
		if !ok {
			rel.missing = d.names[k]
			break
		}
	}
	return nil
}

func contentType(oid uint32) string {
	switch oid {
	case oidJSON, oidJSONB:
		return event.ContentTypeJSON
	case oidText, oidVarchar:
		return event.ContentTypeText
	case oidBytea:
		return event.ContentTypeBinary
	}
	return ""
}

// insert decodes an Insert message. Only inserts into the outbox relation
// produce rows; the tuple is read in place, without a copy per column.
func (d *decoder) insert(body []byte) (decoded, error) {
	if len(body) < 7 || body[4] != 'N' {
		return decoded{}, fmt.Errorf("%w: short insert message", errProtocol)
	}
	rel := d.rels[binary.BigEndian.Uint32(body)]
	if rel == nil {
		return decoded{}, fmt.Errorf("%w: insert into relation %d before its Relation message", errProtocol, binary.BigEndian.Uint32(body))
	}
	if !rel.outbox {
		return decoded{}, nil
	}
	if err := d.readTuple(body[5:], rel); err != nil {
		return decoded{}, err
	}
	return d.row(rel), nil
}

// row decodes the row of rel in d.vals: an event, or a bad row.
func (d *decoder) row(rel *relation) decoded {
	ev, seq, err := d.event(rel)
	if err != nil {
		return decoded{kind: kindRow, bad: d.badRow(err), xid: d.xid}
	}
	var stored string
	if id := d.vals[fID]; !canonicalUUID(id) {
		stored = string(id)
	}
	return decoded{kind: kindRow, ev: ev, seq: seq, stored: stored, xid: d.xid}
}

// readTuple points d.vals at the mapped columns of a TupleData; NULL
// columns are nil.
func (d *decoder) readTuple(src []byte, rel *relation) error {
	d.vals = [numFields][]byte{}
	n := int(binary.BigEndian.Uint16(src))
	p := 2
	for i := range n {
		if p >= len(src) {
			return fmt.Errorf("%w: truncated tuple", errProtocol)
		}
		var v []byte
		switch src[p] {
		case pglogrepl.TupleDataTypeNull, pglogrepl.TupleDataTypeToast:
			p++
		case pglogrepl.TupleDataTypeText:
			if p+5 > len(src) {
				return fmt.Errorf("%w: truncated tuple", errProtocol)
			}
			size := int(binary.BigEndian.Uint32(src[p+1:]))
			p += 5
			if size < 0 || p+size > len(src) {
				return fmt.Errorf("%w: truncated tuple", errProtocol)
			}
			v = src[p : p+size : p+size]
			p += size
		default:
			return fmt.Errorf("%w: tuple column kind %q", errProtocol, src[p])
		}
		if i < len(rel.field) && rel.field[i] >= 0 {
			d.vals[rel.field[i]] = v
		}
	}
	return nil
}

// event builds an event from d.vals. The four text fields, the id and the
// created_at text share one string allocation.
func (d *decoder) event(rel *relation) (*event.Event, int64, error) {
	if rel.missing != "" {
		return nil, 0, fmt.Errorf("column %q is not in the replicated outbox table", rel.missing)
	}
	if rel.contentType == "" {
		return nil, 0, fmt.Errorf("payload type %d is not supported (use jsonb, json, text or bytea)", rel.payloadType)
	}
	v := &d.vals
	for _, k := range []int{fID, fAggregateType, fAggregateID, fEventType, fPayload, fSeq} {
		if v[k] == nil && (k != fSeq || d.names[fSeq] != "") {
			return nil, 0, fmt.Errorf("%s is NULL", d.names[k])
		}
	}
	sc, err := appendID(d.scratch[:0], v[fID])
	if err != nil {
		return nil, 0, err
	}
	seq, err := int64(d.commit), error(nil) // an outbox without seq: the commit's position
	if d.names[fSeq] != "" {
		seq, err = parseInt(v[fSeq])
	}
	if err != nil {
		return nil, 0, fmt.Errorf("%s %q is not an integer", d.names[fSeq], v[fSeq])
	}
	payload, err := d.payload(rel, v[fPayload])
	if err != nil {
		return nil, 0, err
	}
	ev := &event.Event{Payload: payload, ContentType: rel.contentType, Position: uint64(d.commit)}
	if v[fHeaders] != nil {
		if ev.Headers, err = event.ParseHeaders(v[fHeaders]); err != nil {
			return nil, 0, fmt.Errorf("headers must be a JSON object of strings: %v", err)
		}
	}
	for _, k := range []int{fAggregateType, fAggregateID, fEventType, fCreatedAt, fOrder} {
		sc = append(sc, v[k]...)
	}
	d.scratch = sc
	s := string(sc)
	i := 36
	cut := func(k int) string {
		t := s[i : i+len(v[k])]
		i += len(v[k])
		return t
	}
	ev.ID = s[:36]
	ev.AggregateType, ev.AggregateID, ev.EventType = cut(fAggregateType), cut(fAggregateID), cut(fEventType)
	if v[fCreatedAt] != nil {
		if ev.CreatedAt, err = parseTimestamp(cut(fCreatedAt)); err != nil {
			return nil, 0, err
		}
	} else if d.names[fCreatedAt] == "" {
		ev.CreatedAt = d.commitAt // an outbox without created_at
	}
	ev.OrderKey = cut(fOrder)
	return ev, seq, nil
}

// payload copies the payload out of the message; bytea arrives as \x hex
// text and is decoded to its bytes.
func (d *decoder) payload(rel *relation, v []byte) ([]byte, error) {
	if rel.payloadType != oidBytea {
		return append(make([]byte, 0, len(v)), v...), nil
	}
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' {
		return nil, fmt.Errorf("bytea payload is not in hex format (bytea_output)")
	}
	out := make([]byte, hex.DecodedLen(len(v)-2))
	if _, err := hex.Decode(out, v[2:]); err != nil {
		return nil, fmt.Errorf("bytea payload: %v", err)
	}
	return out, nil
}

// size returns the bytes r holds, counted like event.Event.Size.
func (r *badRow) size() int {
	n := event.Overhead + len(r.err)
	for _, v := range r.vals {
		if v != nil {
			n += len(*v)
		}
	}
	return n
}

// badRow keeps the values of a row that cannot become an event.
func (d *decoder) badRow(err error) *badRow {
	b := &badRow{err: "bad row: " + err.Error()}
	for k, v := range d.vals {
		if v != nil {
			s := string(v)
			b.vals[k] = &s
		}
	}
	return b
}

// appendID appends the canonical text form of the UUID id: as it is when
// it is canonical already, as PostgreSQL prints a uuid.
func appendID(dst, id []byte) ([]byte, error) {
	if canonicalUUID(id) {
		return append(dst, id...), nil
	}
	u, err := uuid.ParseBytes(id)
	if err != nil {
		return dst, fmt.Errorf("id %q is not a UUID", id)
	}
	return appendUUID(dst, u), nil
}

// canonicalUUID reports whether b is a UUID in its canonical text form:
// 36 characters, lower-case hex digits and dashes at 8, 13, 18 and 23.
func canonicalUUID(b []byte) bool {
	if len(b) != 36 || b[8] != '-' || b[13] != '-' || b[18] != '-' || b[23] != '-' {
		return false
	}
	var bad byte
	for i, c := range b[:36] {
		bad |= notHex[c] &^ dashAt[i]
	}
	return bad == 0
}

// dashAt is 1 at the dashes of a canonical UUID.
var dashAt = [36]byte{8: 1, 13: 1, 18: 1, 23: 1}

// notHex is 0 for lower-case hex digits, 1 for other bytes.
var notHex = func() (t [256]byte) {
	for c := range t {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			t[c] = 1
		}
	}
	return t
}()

// appendUUID appends the canonical text form of u.
func appendUUID(dst []byte, u uuid.UUID) []byte {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	hex.Encode(b[9:13], u[4:6])
	hex.Encode(b[14:18], u[6:8])
	hex.Encode(b[19:23], u[8:10])
	hex.Encode(b[24:], u[10:])
	b[8], b[13], b[18], b[23] = '-', '-', '-', '-'
	return append(dst, b[:]...)
}

// parseInt parses a decimal int64 without allocating.
func parseInt(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, errors.New("not an integer")
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errors.New("not an integer")
		}
		n = n*10 + int64(c-'0')
	}
	if n < 0 {
		return 0, errors.New("out of range")
	}
	if neg {
		n = -n
	}
	return n, nil
}

// timestampLayouts are the ISO forms of timestamptz (the replication
// connection sets DateStyle ISO and TimeZone UTC) and of timestamp, which
// is taken as UTC.
var timestampLayouts = []string{
	"2006-01-02 15:04:05.999999999-07",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999-07:00:00",
	"2006-01-02 15:04:05.999999999",
}

// parseTimestamp parses created_at. The form PostgreSQL sends is read
// without time.Parse; anything else (BC dates, infinity, years past 9999,
// other separators) is left to timestampLayouts, with the same result.
func parseTimestamp(s string) (time.Time, error) {
	if t, ok := parseISOTimestamp(s); ok {
		return t, nil
	}
	for _, layout := range timestampLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("created_at %q is not an ISO timestamp", s)
}

// parseISOTimestamp parses "YYYY-MM-DD hh:mm:ss[.f…][±hh[:mm[:ss]]]", with
// one to nine fraction digits, as time.Parse does with timestampLayouts:
// UTC without an offset, time.Local when its offset at that instant is the
// given one, otherwise a fixed zone. It reports false for anything else.
func parseISOTimestamp(s string) (time.Time, bool) {
	if len(s) < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digits(s[0:4])
	month, ok2 := digits(s[5:7])
	day, ok3 := digits(s[8:10])
	hour, ok4 := digits(s[11:13])
	minute, ok5 := digits(s[14:16])
	sec, ok6 := digits(s[17:19])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || month < 1 || month > 12 ||
		day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	rest, nsec := s[19:], 0
	if len(rest) > 0 && rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 1 || n > 10 {
			return time.Time{}, false
		}
		f, _ := digits(rest[1:n])
		for range 10 - n {
			f *= 10
		}
		rest, nsec = rest[n:], f
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if rest == "" {
		return t, true
	}
	offset, ok := parseOffset(rest)
	if !ok {
		return time.Time{}, false
	}
	t = t.Add(-time.Duration(offset) * time.Second)
	if _, local := t.In(time.Local).Zone(); local == offset {
		return t.In(time.Local), true
	}
	return t.In(time.FixedZone("", offset)), true
}

// parseOffset parses "±hh", "±hh:mm" or "±hh:mm:ss" into seconds east of
// UTC.
func parseOffset(s string) (int, bool) {
	if (len(s) != 3 && len(s) != 6 && len(s) != 9) || (s[0] != '+' && s[0] != '-') {
		return 0, false
	}
	h, ok := digits(s[1:3])
	m, sec, okm, oks := 0, 0, true, true
	if len(s) >= 6 {
		m, okm = digits(s[4:6])
		okm = okm && s[3] == ':'
	}
	if len(s) == 9 {
		sec, oks = digits(s[7:9])
		oks = oks && s[6] == ':'
	}
	if !ok || !okm || !oks || h > 24 || m > 59 || sec > 59 {
		return 0, false
	}
	off := (h*60+m)*60 + sec
	if s[0] == '-' {
		off = -off
	}
	return off, true
}

// digits parses s, made of decimal digits only.
func digits(s string) (int, bool) {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// daysIn returns the number of days of month in year (proleptic
// Gregorian, as time does).
func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

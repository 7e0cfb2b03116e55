package wal

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/outboxrelay/relay/event"
)

// # The table-free outbox
//
// With Options.MessagePrefix the source captures the transactional logical
// decoding messages the application writes with
// pg_logical_emit_message(true, prefix, content) instead of the outbox
// table's inserts. pgoutput sends them (option messages, PostgreSQL 14 and
// later) inside their transaction, in commit order, so they go through the
// same batches, ack and confirmed position as rows: the slot is confirmed
// only past messages that were published or dead-lettered. Their content
// is a JSON object (docs/reference.md); one that is not a valid event is a
// bad row, written with its raw content to the dead-letter table. There is
// no table to archive, drain or look replayed events up in: a replayed
// message is published again with the same id.

// messageContent is the JSON content of an outbox message. Fields that are
// absent stay nil.
type messageContent struct {
	ID            *string         `json:"id"`
	AggregateType *string         `json:"aggregate_type"`
	AggregateID   *string         `json:"aggregate_id"`
	EventType     *string         `json:"event_type"`
	OrderKey      *string         `json:"order_key"`
	CreatedAt     *string         `json:"created_at"`
	Headers       json.RawMessage `json:"headers"`
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
}

// message decodes a logical decoding message: one with the source's prefix
// is an outbox event, or a bad row when its content is not one; others are
// ignored.
func (d *decoder) message(body []byte) (decoded, error) {
	if d.prefix == "" {
		return decoded{}, nil
	}
	if err := checkMessageFrame(body); err != nil {
		return decoded{}, err
	}
	var m pglogrepl.LogicalDecodingMessage
	if err := m.Decode(body); err != nil {
		return decoded{}, fmt.Errorf("%w: %v", errProtocol, err)
	}
	if m.Prefix != d.prefix {
		return decoded{}, nil
	}
	ev, err := d.messageEvent(m)
	if err != nil {
		return decoded{kind: kindRow, bad: d.badMessage(m, err), xid: d.xid}, nil
	}
	return decoded{kind: kindRow, ev: ev, seq: int64(m.LSN), xid: d.xid}, nil
}

// checkMessageFrame checks that a Message body (flags, LSN, prefix, length,
// content) holds what its lengths say, so that decoding it cannot read
// past its end.
func checkMessageFrame(body []byte) error {
	end := bytes.IndexByte(body[min(9, len(body)):], 0)
	if len(body) < 14 || end < 0 || len(body) < 9+end+1+4 {
		return fmt.Errorf("%w: short logical decoding message", errProtocol)
	}
	n := body[9+end+1:]
	if size := int64(n[0])<<24 | int64(n[1])<<16 | int64(n[2])<<8 | int64(n[3]); size > int64(len(n)-4) {
		return fmt.Errorf("%w: truncated logical decoding message", errProtocol)
	}
	return nil
}

// messageEvent returns the event m's content describes, or why it is not
// one.
func (d *decoder) messageEvent(m pglogrepl.LogicalDecodingMessage) (*event.Event, error) {
	if !m.Transactional || !d.inTx {
		return nil, errors.New("not transactional: emit it with pg_logical_emit_message(true, ...) inside the transaction")
	}
	c, err := parseContent(m.Content)
	if err != nil {
		return nil, err
	}
	for i, v := range []*string{c.ID, c.AggregateType, c.AggregateID, c.EventType} {
		if v == nil {
			return nil, fmt.Errorf("%s is missing", contentFields[i])
		}
	}
	id, err := uuid.Parse(*c.ID)
	if err != nil {
		return nil, fmt.Errorf("id %s is not a UUID", strconv.Quote(*c.ID))
	}
	ev := &event.Event{ID: id.String(), AggregateType: *c.AggregateType, AggregateID: *c.AggregateID, EventType: *c.EventType,
		Position: uint64(d.commit), CreatedAt: d.commitAt}
	if c.OrderKey != nil {
		ev.OrderKey = *c.OrderKey
	}
	if ev.Payload, ev.ContentType, err = c.payload(); err != nil {
		return nil, err
	}
	if c.Headers != nil && string(c.Headers) != "null" {
		if ev.Headers, err = messageHeaders(c.Headers); err != nil {
			return nil, err
		}
	}
	if c.CreatedAt != nil {
		if ev.CreatedAt, err = parseCreatedAt(*c.CreatedAt); err != nil {
			return nil, err
		}
	}
	return ev, nil
}

// parseContent decodes a message's content. Content that is not valid
// UTF-8 JSON, or whose strings hold a NUL character (which no text column
// of the dead-letter table could keep), is refused; a field of the wrong
// type is refused with the fields decoded so far set.
func parseContent(content []byte) (*messageContent, error) {
	var c messageContent
	if !utf8.Valid(content) {
		return &c, errors.New("content is not UTF-8")
	}
	if err := json.Unmarshal(content, &c); err != nil {
		return &c, fmt.Errorf("content is not a JSON object of the outbox message fields: %v", err)
	}
	for i, v := range []*string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.OrderKey, c.CreatedAt} {
		if v != nil && strings.ContainsRune(*v, 0) {
			return &c, fmt.Errorf("%s holds a NUL character", contentFields[i])
		}
	}
	return &c, nil
}

// contentFields are the names of messageContent's string fields, in order.
var contentFields = []string{"id", "aggregate_type", "aggregate_id", "event_type", "order_key", "created_at"}

// payload returns the payload's bytes and content type: the JSON value of
// payload as it is written, or the bytes payload_base64 encodes.
func (c *messageContent) payload() ([]byte, string, error) {
	hasJSON := c.Payload != nil && string(c.Payload) != "null"
	switch {
	case hasJSON && c.PayloadBase64 != nil:
		return nil, "", errors.New("payload and payload_base64 are both set")
	case hasJSON:
		return bytes.Clone(c.Payload), event.ContentTypeJSON, nil
	case c.PayloadBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*c.PayloadBase64)
		if err != nil {
			return nil, "", fmt.Errorf("payload_base64 is not standard base64: %v", err)
		}
		return b, event.ContentTypeBinary, nil
	}
	return nil, "", errors.New("payload is missing (set payload to a JSON value or payload_base64 to base64 bytes)")
}

// messageHeaders parses headers, a JSON object of strings without NUL
// characters (the dead-letter table keeps them as jsonb).
func messageHeaders(raw []byte) (map[string]string, error) {
	h, err := event.ParseHeaders(raw)
	if err != nil {
		return nil, fmt.Errorf("headers must be a JSON object of strings: %v", err)
	}
	for k, v := range h {
		if strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return nil, errors.New("headers hold a NUL character")
		}
	}
	return h, nil
}

// parseCreatedAt parses created_at: RFC 3339, as to_json(now()) writes it,
// or PostgreSQL's text form.
func parseCreatedAt(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return parseTimestamp(s)
}

// badMessage returns the dead-letter row of a malformed message: what its
// content holds of the outbox fields, when it decodes that far, the raw
// content as payload, the message's WAL position as seq, and err.
func (d *decoder) badMessage(m pglogrepl.LogicalDecodingMessage, err error) *badRow {
	b := &badRow{err: "bad outbox message: " + err.Error()}
	str := func(s string) *string { return &s }
	b.vals[fPayload] = str(`\x` + hex.EncodeToString(m.Content))
	b.vals[fSeq] = str(strconv.FormatInt(int64(m.LSN), 10))
	c, perr := parseContent(m.Content)
	if perr != nil && c.ID == nil {
		return b
	}
	for k, v := range map[int]*string{fID: c.ID, fAggregateType: c.AggregateType, fAggregateID: c.AggregateID,
		fEventType: c.EventType, fOrder: c.OrderKey} {
		if v != nil && !strings.ContainsRune(*v, 0) && (k != fOrder || d.names[fOrder] != "") {
			b.vals[k] = v
		}
	}
	if c.Headers != nil {
		if h, err := messageHeaders(c.Headers); err == nil && h != nil {
			j, _ := json.Marshal(h) // a map of strings always marshals
			b.vals[fHeaders] = str(string(j))
		}
	}
	if c.CreatedAt != nil {
		if t, err := parseCreatedAt(*c.CreatedAt); err == nil {
			b.vals[fCreatedAt] = str(t.Format(time.RFC3339Nano))
		}
	}
	return b
}

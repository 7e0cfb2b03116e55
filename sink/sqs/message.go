package sqs

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
)

// Message attribute names the sink sets. maxAttributes is SQS's limit per
// message.
const (
	attrMessageID     = "message_id"
	attrEventType     = "event_type"
	attrAggregateType = "aggregate_type"
	attrAggregateID   = "aggregate_id"
	attrContentType   = "content_type"
	attrBodyEncoding  = "body_encoding"
	attrHeaders       = "headers"
	maxAttributes     = 10
	traceparent       = "traceparent"
	tracestate        = "tracestate"

	// Values of body_encoding.
	encodingBase64 = "base64"
	encodingEmpty  = "empty"
	// emptyBody stands for an empty payload: SQS bodies have at least one
	// character.
	emptyBody = "-"

	stringType = "String"
	binaryType = "Binary"
)

// message is one event as an SQS message, without the batch entry Id.
type message struct {
	body       string
	attrs      map[string]types.MessageAttributeValue
	groupID    string // FIFO only
	dedupID    string // FIFO only
	size       int    // body and attributes, as SQS counts against its limits
	headerJSON bool   // the row's headers went into the "headers" attribute
}

// newMessage builds the message of e for a FIFO or standard queue, with
// the row headers rows forwards.
func newMessage(e *event.Event, fifo bool, rows *sink.HeaderFilter) message {
	m := message{attrs: make(map[string]types.MessageAttributeValue, maxAttributes)}
	encoding := ""
	switch {
	case len(e.Payload) == 0:
		m.body, encoding = emptyBody, encodingEmpty
	case e.ContentType != event.ContentTypeBinary && validText(e.Payload):
		m.body = string(e.Payload)
	default:
		m.body, encoding = base64.StdEncoding.EncodeToString(e.Payload), encodingBase64
	}
	m.set(attrMessageID, e.ID)
	m.set(attrEventType, e.EventType)
	m.set(attrAggregateType, e.AggregateType)
	m.set(attrAggregateID, e.AggregateID)
	m.set(attrContentType, e.ContentType)
	m.set(attrBodyEncoding, encoding)
	m.addHeaders(e.Headers, rows)
	m.size = len(m.body)
	for name, v := range m.attrs {
		m.size += len(name) + len(*v.DataType) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	if fifo {
		m.groupID = fifoID(e.Key())
		m.dedupID = fifoID(e.ID)
	}
	return m
}

// structured returns a copy of e whose payload is e in the CloudEvents JSON
// event format.
func structured(e *event.Event, env *envelope.CloudEvents) *event.Event {
	c := *e
	c.Payload, c.ContentType = env.Structured(e), envelope.StructuredContentType
	return &c
}

// set adds an attribute unless value is empty: a String attribute, or a
// Binary one holding value's bytes when value is not text SQS can carry (it
// has control characters or is not UTF-8).
func (m *message) set(name, value string) {
	if value == "" {
		return
	}
	if !validText([]byte(value)) {
		m.attrs[name] = types.MessageAttributeValue{DataType: aws.String(binaryType), BinaryValue: []byte(value)}
		return
	}
	m.attrs[name] = types.MessageAttributeValue{DataType: aws.String(stringType), StringValue: aws.String(value)}
}

// addHeaders adds the row headers filter forwards: one attribute each
// when all fit and SQS accepts their names and values, else one "headers"
// attribute holding them as a JSON object, all but traceparent and
// tracestate, which stay attributes.
func (m *message) addHeaders(h map[string]string, filter *sink.HeaderFilter) {
	rows := make(map[string]string, len(h))
	for k, v := range h {
		if filter.Forward(k) {
			rows[k] = v
		}
	}
	if len(rows) == 0 {
		return
	}
	each := len(m.attrs)+len(rows) <= maxAttributes
	for k, v := range rows {
		if !each {
			break
		}
		each = validAttributeName(k) && k != attrHeaders && v != ""
	}
	if each {
		for k, v := range rows {
			m.set(k, v)
		}
		return
	}
	// The W3C trace context keeps attributes of its own, where tracing
	// instrumentation looks for it: 9 attributes at most.
	for _, k := range []string{traceparent, tracestate} {
		if v := rows[k]; v != "" {
			m.set(k, v)
			delete(rows, k)
		}
	}
	if len(rows) > 0 {
		m.set(attrHeaders, headersJSON(rows))
		m.headerJSON = true
	}
}

// headersJSON returns h as a JSON object with sorted keys, without HTML
// escaping; encoding/json escapes control characters and replaces invalid
// UTF-8, and notText escapes the two noncharacters SQS refuses, so the
// result is valid SQS text.
func headersJSON(h map[string]string) string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		enc.Encode(k)
		b.Truncate(b.Len() - 1) // Encode's newline
		b.WriteByte(':')
		enc.Encode(h[k])
		b.Truncate(b.Len() - 1)
	}
	b.WriteByte('}')
	return notText.Replace(b.String())
}

// notText escapes, in JSON text, the characters that are valid UTF-8 and
// that encoding/json leaves as they are, but that SQS does not allow
// (allowedRune): U+FFFE and U+FFFF.
var notText = strings.NewReplacer("\ufffe", `\ufffe`, "\uffff", `\uffff`)

// allowedRune reports whether SQS allows r in a message body or attribute
// value: #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to
// #x10FFFF.
func allowedRune(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		r >= 0x20 && r <= 0xD7FF ||
		r >= 0xE000 && r <= 0xFFFD ||
		r >= 0x10000 && r <= utf8.MaxRune
}

// validText reports whether b is UTF-8 made only of characters SQS allows.
func validText(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 || !allowedRune(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// validAttributeName reports whether SQS accepts name as a message
// attribute name: 1 to 256 of A-Z a-z 0-9 _ - ., not starting or ending
// with '.', no "..", and no reserved prefix "AWS." or "Amazon" in any case.
func validAttributeName(name string) bool {
	if name == "" || len(name) > 256 || name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
		return false
	}
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// maxFIFOID is the longest MessageGroupId or MessageDeduplicationId.
const maxFIFOID = 128

// fifoID returns v when SQS accepts it as a MessageGroupId or
// MessageDeduplicationId (1 to 128 printable ASCII characters other than
// space), else a deterministic valid ID derived from it: the characters SQS
// does not allow replaced by '_', cut to 111 characters, then '-' and the
// first 16 hex digits of v's SHA-256.
func fifoID(v string) string {
	if v != "" && len(v) <= maxFIFOID && strings.IndexFunc(v, func(r rune) bool { return r < 0x21 || r > 0x7E }) < 0 {
		return v
	}
	var b strings.Builder
	for _, r := range v {
		if b.Len() == maxFIFOID-17 {
			break
		}
		if r < 0x21 || r > 0x7E {
			r = '_'
		}
		b.WriteRune(r)
	}
	sum := sha256.Sum256([]byte(v))
	return fmt.Sprintf("%s-%s", b.String(), hex.EncodeToString(sum[:8]))
}

// entry returns m as a batch entry with the given Id.
func (m *message) entry(id string) types.SendMessageBatchRequestEntry {
	e := types.SendMessageBatchRequestEntry{
		Id:                aws.String(id),
		MessageBody:       aws.String(m.body),
		MessageAttributes: m.attrs,
	}
	if m.groupID != "" {
		e.MessageGroupId = aws.String(m.groupID)
		e.MessageDeduplicationId = aws.String(m.dedupID)
	}
	return e
}

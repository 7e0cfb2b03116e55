package outbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
)

// DefaultPrefix is the prefix Emit writes its messages with: the relay's
// default capture.wal.message_prefix.
const DefaultPrefix = "outbox"

// EmitSQL is the statement Emit runs: $1 the prefix, $2 the message's JSON
// content (see docs/reference.md of the relay). The message is
// transactional: the relay sees it only once the transaction commits, in
// commit order, and never when it rolls back.
const EmitSQL = `SELECT pg_logical_emit_message(true, $1, $2::text)`

// Emit writes e as an outbox message of the relay's table-free outbox
// (capture.wal.source: messages, PostgreSQL 14 and later) with db, usually
// the transaction of the business write, and returns the event's id. It
// writes no table: pg_logical_emit_message puts the event in the WAL, from
// which the relay streams it. The payload is sent as JSON (the event's
// content type application/json), except a []byte payload, which is sent
// as bytes (payload_base64, application/octet-stream); a json.RawMessage
// must hold valid JSON. Headers get the trace context of ctx as Write
// describes. An invalid event, or one whose strings hold a NUL character
// (which the relay would dead-letter), returns an error wrapping
// ErrInvalidEvent and writes nothing.
func Emit(ctx context.Context, db Execer, e Event) (string, error) {
	return EmitPrefix(ctx, db, DefaultPrefix, e)
}

// EmitPrefix is Emit with the message prefix prefix, which must be the
// relay's capture.wal.message_prefix.
func EmitPrefix(ctx context.Context, db Execer, prefix string, e Event) (string, error) {
	e.Headers = traceHeaders(ctx, e.Headers)
	content, id, err := e.message()
	if err != nil {
		return "", fmt.Errorf("outbox: %w", err)
	}
	if _, err := db.Exec(ctx, EmitSQL, prefix, content); err != nil {
		return "", fmt.Errorf("outbox: emit message: %w", err)
	}
	return id, nil
}

// message returns the event's JSON content for the table-free outbox and
// its id.
func (e Event) message() (string, string, error) {
	binary := false
	if _, ok := e.Payload.([]byte); ok {
		binary = true
	}
	args, err := e.args(binary)
	if err != nil {
		return "", "", err
	}
	m := map[string]any{"id": args[0], "aggregate_type": e.AggregateType, "aggregate_id": e.AggregateID, "event_type": e.EventType}
	for _, s := range []string{e.AggregateType, e.AggregateID, e.EventType} {
		if strings.ContainsRune(s, 0) {
			return "", "", fmt.Errorf("%w: a NUL character in %q", ErrInvalidEvent, s)
		}
	}
	if binary {
		m["payload_base64"] = base64.StdEncoding.EncodeToString(args[4].([]byte))
	} else {
		raw := json.RawMessage(args[4].(string))
		if !json.Valid(raw) {
			return "", "", fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
		}
		m["payload"] = raw
	}
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			if strings.ContainsRune(k+v, 0) {
				return "", "", fmt.Errorf("%w: a NUL character in header %q", ErrInvalidEvent, k)
			}
		}
		m["headers"] = e.Headers
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the payload keeps its characters
	if err := enc.Encode(m); err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), args[0].(string), nil
}

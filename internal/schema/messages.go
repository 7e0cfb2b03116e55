package schema

import (
	"context"
	"fmt"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// MessageInfo returns the Info of the table-free outbox (capture.wal.source
// messages), which has no outbox table: the dead-letter table's columns
// take types that hold any message, malformed ones included. The id, the
// names and the order key are text, the payload bytea (an event's payload
// bytes, or a malformed message's raw content), headers jsonb, created_at
// timestamptz and seq bigint (the message's WAL position).
func (l Layout) MessageInfo() Info {
	c := l.Cols
	types := map[string]string{c.ID: "text", c.AggregateType: "text", c.AggregateID: "text", c.EventType: "text",
		c.Payload: "bytea", c.Headers: "jsonb", c.CreatedAt: "timestamp with time zone", c.Seq: "bigint"}
	if c.OrderBy != "" {
		types[c.OrderBy] = "text"
	}
	return Info{Types: types, ContentType: event.ContentTypeBinary}
}

// EnsureMessageDeadLetter creates the dead-letter table of the table-free
// outbox when it is missing (see MessageInfo) and fails permanently when
// it exists with an id or payload column that cannot hold any message,
// such as the uuid id and jsonb payload of a table made for an outbox
// table.
func EnsureMessageDeadLetter(ctx context.Context, q Querier, l Layout) error {
	if err := EnsureDeadLetter(ctx, q, l, l.MessageInfo()); err != nil {
		return err
	}
	var id, payload string
	err := q.QueryRow(ctx, `SELECT
		  coalesce((SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped), ''),
		  coalesce((SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = $3 AND NOT attisdropped), '')`,
		l.DeadLetter.Ident(), l.Cols.ID, l.Cols.Payload).Scan(&id, &payload)
	if err != nil {
		return fmt.Errorf("inspect dead-letter table %s: %w", l.DeadLetter, err)
	}
	if id != "text" || payload != "bytea" {
		return fault.AsPermanent(fmt.Errorf("dead-letter table %s has %s %s and %s %s; capture.wal.source messages needs text and bytea, "+
			"so that a malformed message's raw content fits: set dead_letter.table to a new table, which the relay creates", l.DeadLetter,
			Q(l.Cols.ID), orNone(id), Q(l.Cols.Payload), orNone(payload)))
	}
	return nil
}

func orNone(t string) string {
	if t == "" {
		return "no such column"
	}
	return t
}

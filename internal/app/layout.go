package app

import (
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/schema"
)

// layoutOf builds the table layout from a loaded config.
func layoutOf(cfg *config.Config) schema.Layout {
	o := cfg.Outbox
	l := schema.Layout{
		Outbox: table.ParseName(o.Table),
		Cols: schema.Columns{
			ID: o.Column("id"), AggregateType: o.Column("aggregate_type"), AggregateID: o.Column("aggregate_id"),
			EventType: o.Column("event_type"), Payload: o.Column("payload"), Headers: o.Column("headers"),
			CreatedAt: o.Column("created_at"), Seq: o.Column("seq"),
		},
		DeadLetter: table.ParseName(cfg.DeadLetter.Table),
		Archive:    table.ParseName(cfg.Archive.Table),
	}
	if c := o.OrderColumn(); c != l.Cols.AggregateID {
		l.Cols.OrderBy = c
	}
	return l
}

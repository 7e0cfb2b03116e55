package wal

import (
	"strings"
	"testing"
)

// TestDecodeOrderColumn reads outbox.order_by's column ("extra", an int4)
// as the event's OrderKey: its text, empty when NULL (the key is then the
// aggregate id); a relation without it yields bad rows naming it.
func TestDecodeOrderColumn(t *testing.T) {
	l := testLayout
	l.Cols.OrderBy = "extra"
	d := newDecoder(l, nil)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
	mustDecode(t, d, beginMsg(1))
	r := mustDecode(t, d, insertMsg(1, row()...))
	if r.ev == nil || r.ev.OrderKey != "7" || r.ev.Key() != "7" || r.ev.AggregateID != "order-1" || r.ev.EventType != "created" {
		t.Fatalf("decoded %+v, want order key 7", r.ev)
	}
	v := row()
	v[1] = nil
	if r := mustDecode(t, d, insertMsg(1, v...)); r.ev == nil || r.ev.OrderKey != "" || r.ev.Key() != "order-1" {
		t.Fatalf("NULL order column decoded %+v, want the aggregate id as key", r.ev)
	}
	without := append(outboxCols[:1:1], outboxCols[2:]...)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, without))
	v = append(row()[:1:1], row()[2:]...)
	if r := mustDecode(t, d, insertMsg(1, v...)); r.bad == nil || !strings.Contains(r.bad.err, `column "extra"`) {
		t.Fatalf("relation without the order column decoded %+v, want a bad row naming it", r)
	}
}

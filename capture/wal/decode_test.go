package wal

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/schema"
)

var testLayout = schema.Layout{
	Outbox: schema.Table{Schema: "app data", Name: `Out "Box`},
	Cols: schema.Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "Order Id",
		EventType: "event_type", Payload: "body", Headers: "headers", CreatedAt: "created_at", Seq: "seq"},
}

type col struct {
	name string
	oid  uint32
}

// outboxCols are the outbox columns in an unusual order, with an extra one.
var outboxCols = []col{{"seq", 20}, {"extra", 23}, {"Order Id", oidText}, {"id", 2950}, {"aggregate_type", oidText},
	{"event_type", oidText}, {"body", oidJSONB}, {"headers", oidJSONB}, {"created_at", 1184}}

func relationMsg(id uint32, ns, name string, cols []col) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, id)
	b = append(append(b, ns...), 0)
	b = append(append(b, name...), 0)
	b = append(b, 'd')
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for _, c := range cols {
		b = append(b, 0)
		b = append(append(b, c.name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.oid)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff)
	}
	return b
}

// insertMsg builds an Insert; a nil value is NULL.
func insertMsg(rel uint32, vals ...*string) []byte {
	b := []byte{'I'}
	b = binary.BigEndian.AppendUint32(b, rel)
	b = append(b, 'N')
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(*v)))
		b = append(b, *v...)
	}
	return b
}

func beginMsg(final uint64) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, final)
	b = binary.BigEndian.AppendUint64(b, 0)
	return binary.BigEndian.AppendUint32(b, 7)
}

func commitMsg(commit, end uint64) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, commit)
	b = binary.BigEndian.AppendUint64(b, end)
	return binary.BigEndian.AppendUint64(b, 0)
}

func s(v string) *string { return &v }

const testID = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"

// row returns the values of an outbox row in outboxCols order.
func row() []*string {
	return []*string{s("42"), s("7"), s("order-1"), s(testID), s("order"), s("created"), s(`{"a": 1}`),
		s(`{"trace": "x"}`), s("2024-02-29 23:59:58.123456+00")}
}

func mustDecode(t *testing.T, d *decoder, msg []byte) decoded {
	t.Helper()
	r, err := d.decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDecodeTransaction(t *testing.T) {
	d := newDecoder(testLayout, nil)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
	mustDecode(t, d, beginMsg(1000))
	r := mustDecode(t, d, insertMsg(1, row()...))
	if r.kind != kindRow || r.ev == nil {
		t.Fatalf("decoded %+v", r)
	}
	ev := r.ev
	want := time.Date(2024, 2, 29, 23, 59, 58, 123456000, time.UTC)
	if ev.ID != testID || ev.AggregateType != "order" || ev.AggregateID != "order-1" || ev.EventType != "created" ||
		string(ev.Payload) != `{"a": 1}` || ev.ContentType != event.ContentTypeJSON || ev.Headers["trace"] != "x" ||
		!ev.CreatedAt.Equal(want) || ev.Position != 1000 || r.seq != 42 {
		t.Fatalf("event %+v seq %d", ev, r.seq)
	}
	if !d.inTx {
		t.Fatal("not in a transaction after Begin")
	}
	if r := mustDecode(t, d, commitMsg(1000, 1010)); r.kind != kindCommit || r.end != 1010 || d.inTx {
		t.Fatalf("commit decoded %+v", r)
	}
}

func TestDecodeRelationChangesAndOtherTables(t *testing.T) {
	d := newDecoder(testLayout, nil)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
	mustDecode(t, d, relationMsg(2, "public", `Out "Box`, outboxCols)) // same name, other schema
	mustDecode(t, d, beginMsg(1))
	if r := mustDecode(t, d, insertMsg(2, row()...)); r.kind != kindNone {
		t.Fatalf("insert into another table decoded %+v", r)
	}
	for _, typ := range []byte{'U', 'D', 'T', 'Y', 'O', 'M'} {
		if r := mustDecode(t, d, []byte{typ, 0, 0, 0, 1}); r.kind != kindNone {
			t.Fatalf("message %c decoded %+v", typ, r)
		}
	}
	// ALTER TABLE moved headers to the end and the payload became bytea.
	moved := append(append([]col{}, outboxCols[:6]...), col{"body", oidBytea}, col{"created_at", 1184}, col{"headers", oidJSONB})
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, moved))
	v := row()
	v[6], v[7], v[8] = s(`\x00ff`), v[8], nil
	r := mustDecode(t, d, insertMsg(1, v...))
	if r.ev == nil || string(r.ev.Payload) != "\x00\xff" || r.ev.ContentType != event.ContentTypeBinary || r.ev.Headers != nil || r.ev.CreatedAt.IsZero() {
		t.Fatalf("after the relation changed: %+v", r.ev)
	}
}

func TestDecodeBadRows(t *testing.T) {
	for _, tc := range []struct {
		name string
		cols []col
		edit func(v []*string)
		want string
	}{
		{"null aggregate_id", outboxCols, func(v []*string) { v[2] = nil }, "Order Id is NULL"},
		{"headers not strings", outboxCols, func(v []*string) { v[7] = s(`{"n": 1}`) }, "headers must be a JSON object of strings"},
		{"created_at infinity", outboxCols, func(v []*string) { v[8] = s("infinity") }, "not an ISO timestamp"},
		{"payload type", append([]col{}, append(outboxCols[:6:6], col{"body", 23}, outboxCols[7], outboxCols[8])...), func([]*string) {}, "payload type 23"},
		{"missing column", outboxCols[:8], func(v []*string) {}, `column "created_at"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecoder(testLayout, nil)
			mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, tc.cols))
			v := row()[:len(tc.cols)]
			tc.edit(v)
			r := mustDecode(t, d, insertMsg(1, v...))
			if r.kind != kindRow || r.ev != nil || r.bad == nil || !strings.Contains(r.bad.err, tc.want) {
				t.Fatalf("decoded %+v, want a bad row: %s", r, tc.want)
			}
			if r.bad.vals[fID] == nil || *r.bad.vals[fID] != testID {
				t.Fatalf("bad row lost its id: %+v", r.bad.vals)
			}
		})
	}
}

func TestDecodeMalformedMessages(t *testing.T) {
	d := newDecoder(testLayout, nil)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
	msg := insertMsg(1, row()...)
	for n := 1; n < len(msg); n++ {
		if r, err := d.decode(msg[:n]); err == nil && r.kind == kindRow {
			t.Fatalf("truncated insert of %d bytes decoded: %+v", n, r)
		}
	}
	if _, err := d.decode(insertMsg(9, row()...)); err == nil {
		t.Fatal("insert into an unknown relation decoded")
	}
}

func FuzzDecodeInsert(f *testing.F) {
	f.Add(insertMsg(1, row()...)[1:])
	f.Fuzz(func(t *testing.T, body []byte) {
		d := newDecoder(testLayout, nil)
		if _, err := d.decode(relationMsg(1, "app data", `Out "Box`, outboxCols)); err != nil {
			t.Fatal(err)
		}
		d.decode(append([]byte{'I'}, body...))
	})
}

// TestDecodeAllocations checks an insert costs a fixed handful of
// allocations, not one per column: the event, one string for its text
// fields, the payload and the headers map.
func TestDecodeAllocations(t *testing.T) {
	d := newDecoder(testLayout, nil)
	mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
	v := row()
	v[7] = nil
	msg := insertMsg(1, v...)
	if n := testing.AllocsPerRun(100, func() { d.decode(msg) }); n > 3 {
		t.Fatalf("%v allocations per insert without headers, want at most 3", n)
	}
}

// BenchmarkDecode decodes one transaction of one outbox row, as the
// walsender sends it (Begin, Insert, Commit), with and without headers.
func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		name    string
		headers *string
	}{{"headers", s(`{"source": "relaybench"}`)}, {"no_headers", nil}} {
		b.Run(tc.name, func(b *testing.B) {
			d := newDecoder(testLayout, nil)
			if _, err := d.decode(relationMsg(1, "app data", `Out "Box`, outboxCols)); err != nil {
				b.Fatal(err)
			}
			v := row()
			v[7] = tc.headers
			msgs := [][]byte{beginMsg(1000), insertMsg(1, v...), commitMsg(1000, 1010)}
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range msgs {
					if _, err := d.decode(m); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// TestDecodeIDForms checks the event id is the UUID's canonical text form
// whatever form the row holds it in (a text id column), and that a value
// that is no UUID makes a bad row.
func TestDecodeIDForms(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{testID, testID},
		{strings.ToUpper(testID), testID},
		{"{" + testID + "}", testID},
		{strings.ReplaceAll(testID, "-", ""), testID},
		{"6ba7b810-9dad-11d1-80b4-00c04fd430cg", ""},
		{"6ba7b810-9dad-11d1-80b4x00c04fd430c8", ""},
		{"6ba7b810-9dad-11d1-80b4-00c04fd430-8", ""},
		{"6ba7b810-9dad-11d1-80b4-00c04fd430C8", testID},
		{testID[:35], ""},
	} {
		d := newDecoder(testLayout, nil)
		mustDecode(t, d, relationMsg(1, "app data", `Out "Box`, outboxCols))
		v := row()
		v[3] = s(tc.in)
		r := mustDecode(t, d, insertMsg(1, v...))
		switch {
		case tc.want == "" && (r.bad == nil || !strings.Contains(r.bad.err, "is not a UUID")):
			t.Errorf("id %q: decoded %+v, want a bad row", tc.in, r)
		case tc.want != "" && (r.ev == nil || r.ev.ID != tc.want || r.ev.AggregateType != "order"):
			t.Errorf("id %q: decoded %+v, want id %s", tc.in, r.ev, tc.want)
		}
	}
}

package template

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/outboxrelay/relay/event"
)

// FuzzRender renders templates with row values of any bytes. Without a
// sanitizer the values arrive as they are; with one that maps every rune
// outside printable ASCII to '_' the destination is printable ASCII; a
// cached rendering equals an uncached one. Different values give different
// names, with or without a limit on the name's length, and a limited name
// stays within its limit.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a.b\nc\r\x00", "\u202e\u009b", "", "{aggregate_id}"} {
		f.Add(s, s+"-id", s+"-type")
	}
	for _, pair := range [][2]string{{"order.*", "order.>"}, {"a b", "a\tb"}, {"bad\xff", "bad\xfe"}, {"", "_"}, {"x\ufffd", "x\xff"},
		{strings.Repeat("é", 40), strings.Repeat("é", 39) + "e"}} {
		f.Add(pair[0], "id", pair[1])
	}
	ascii := func(r rune) rune {
		if r < utf8.RuneSelf && unicode.IsPrint(r) {
			return r
		}
		return '_'
	}
	f.Fuzz(func(t *testing.T, typ, id, evType string) {
		e := &event.Event{AggregateType: typ, AggregateID: id, EventType: evType}
		raw, _ := Parse("outbox.{aggregate_type}.{event_type}/{aggregate_id}", nil)
		want := "outbox." + orEmpty(typ) + "." + orEmpty(evType) + "/" + orEmpty(id)
		if got := raw.Render(e); got != want {
			t.Fatalf("Render = %q, want %q", got, want)
		}
		cached, _ := Parse("outbox.{aggregate_type}.{event_type}", ascii)
		got := cached.Render(e)
		if strings.ContainsFunc(got, func(r rune) bool { return ascii(r) != r }) {
			t.Fatalf("sanitized destination %q", got)
		}
		if again := cached.Render(e); again != got || cached.render(e) != got {
			t.Fatalf("cached %q, again %q, uncached %q", got, again, cached.render(e))
		}
		other := &event.Event{AggregateType: evType, AggregateID: id, EventType: typ}
		if typ == evType {
			return
		}
		one, _ := Parse("outbox.{aggregate_type}", ascii)
		if a, b := one.Render(e), one.Render(other); a == b {
			t.Fatalf("values %q and %q both render %q", typ, evType, a)
		}
		const max = 48
		limited, _ := Parse("q.{aggregate_type}.{event_type}", token)
		limited = limited.Limit(max)
		a, b := limited.Render(e), limited.Render(other)
		if a == b {
			t.Fatalf("values (%q, %q) and (%q, %q) both render %q", typ, evType, evType, typ, a)
		}
		if len(a) > max || len(b) > max || !utf8.ValidString(a) || !utf8.ValidString(b) {
			t.Fatalf("limited to %d bytes: %q, %q", max, a, b)
		}
	})
}

// token maps the runes a NATS subject token cannot hold to '_'.
func token(r rune) rune {
	if r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r) {
		return '_'
	}
	return r
}

// orEmpty returns v, or Hash("") for an empty value as Render writes it.
func orEmpty(v string) string {
	if v == "" {
		return Hash("")
	}
	return v
}

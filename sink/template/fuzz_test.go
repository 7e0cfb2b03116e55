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
// cached rendering equals an uncached one.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a.b\nc\r\x00", "\u202e\u009b", "", "{aggregate_id}"} {
		f.Add(s, s+"-id", s+"-type")
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
	})
}

// orEmpty returns v, or "_" for an empty value as Render writes it.
func orEmpty(v string) string {
	if v == "" {
		return "_"
	}
	return v
}

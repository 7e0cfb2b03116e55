// Package template renders destination names (topics, subjects, queues,
// URLs) from an event. It depends only on package event, so both config,
// which validates templates, and the sinks, which render them, can use it.
package template

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outboxrelay/relay/event"
)

// Template is a destination template such as "outbox.{aggregate_type}".
// The placeholders {aggregate_type}, {event_type} and {aggregate_id} are
// replaced from the event; the sanitize function given to Parse maps each rune of a replaced value that
// the broker does not allow in a name, and may be nil.
type Template struct {
	raw      string
	sanitize func(rune) rune
	parts    []part // raw split into literals and placeholders
}

// part is a literal piece of a template or, when field is not fieldNone, a
// placeholder.
type part struct {
	lit   string
	field int
}

const fieldNone = -1

// Placeholders lists the names a template may use; a part's field indexes
// it.
var Placeholders = []string{"{aggregate_type}", "{event_type}", "{aggregate_id}"}

// Parse parses raw. It fails on an unknown {placeholder}.
func Parse(raw string, sanitize func(rune) rune) (Template, error) {
	t := Template{raw: raw, sanitize: sanitize}
	for rest := raw; rest != ""; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t.parts = append(t.parts, part{lit: rest, field: fieldNone})
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("template %q: unclosed {", raw)
		}
		field := slices.Index(Placeholders, rest[i:i+j+1])
		if field < 0 {
			return Template{}, fmt.Errorf("template %q: unknown placeholder %s (allowed: %s)", raw, rest[i:i+j+1], strings.Join(Placeholders, ", "))
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: rest[:i], field: fieldNone})
		}
		t.parts = append(t.parts, part{field: field})
		rest = rest[i+j+1:]
	}
	return t, nil
}

// Raw returns the template text.
func (t Template) Raw() string { return t.raw }

// Render returns the destination of e. An empty value renders as "_". It
// allocates only the result, and nothing for a template without
// placeholders.
func (t Template) Render(e *event.Event) string {
	if len(t.parts) == 1 && t.parts[0].field == fieldNone {
		return t.raw
	}
	var b strings.Builder
	b.Grow(len(t.raw) + len(e.AggregateType) + len(e.AggregateID))
	for _, p := range t.parts {
		switch p.field {
		case fieldNone:
			b.WriteString(p.lit)
		case 0:
			t.write(&b, e.AggregateType)
		case 1:
			t.write(&b, e.EventType)
		default:
			t.write(&b, e.AggregateID)
		}
	}
	return b.String()
}

// write appends v cleaned for the broker.
func (t Template) write(b *strings.Builder, v string) {
	if v == "" {
		b.WriteByte('_')
		return
	}
	if t.sanitize == nil {
		b.WriteString(v)
		return
	}
	for _, r := range v {
		b.WriteRune(t.sanitize(r))
	}
}

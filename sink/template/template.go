// Package template renders destination names (topics, subjects, queues,
// URLs) from an event. It depends only on package event, so both config,
// which validates templates, and the sinks, which render them, can use it.
package template

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/relay/event"
)

// Template is a destination template such as "outbox.{aggregate_type}".
// The placeholders {aggregate_type}, {event_type} and {aggregate_id} are
// replaced from the event; the sanitize function given to Parse maps each rune of a replaced value that
// the broker does not allow in a name, and may be nil. A template without
// {aggregate_id} keeps the destinations it rendered (at most maxCached),
// shared by its copies. A Template is safe for concurrent use.
type Template struct {
	raw      string
	sanitize func(rune) rune
	parts    []part // raw split into literals and placeholders
	cache    *cache // nil when the template uses {aggregate_id} or no placeholder
}

// maxCached bounds the destinations a template keeps; beyond it the others
// are rendered every time, without taking the cache's lock.
const maxCached = 256

// cache holds rendered destinations by the values of {aggregate_type} and
// {event_type}. Readers load the map without locking; a writer copies it.
type cache struct {
	mu sync.Mutex // serializes writers
	m  atomic.Pointer[map[cacheKey]string]
}

// cacheKey holds the values of the placeholders a template uses, "" for the
// others.
type cacheKey struct{ aggregateType, eventType string }

// part is a literal piece of a template or, when field is not fieldNone, a
// placeholder.
type part struct {
	lit   string
	field int
}

const (
	fieldNone          = -1
	fieldAggregateType = 0
	fieldEventType     = 1
	fieldAggregateID   = 2
)

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
	if slices.ContainsFunc(t.parts, func(p part) bool { return p.field != fieldNone }) &&
		!slices.ContainsFunc(t.parts, func(p part) bool { return p.field == fieldAggregateID }) {
		t.cache = &cache{}
	}
	return t, nil
}

// Raw returns the template text.
func (t Template) Raw() string { return t.raw }

// Render returns the destination of e. An empty value renders as "_". It
// allocates only the result, nothing for a template without placeholders,
// and nothing for a destination the template keeps.
func (t Template) Render(e *event.Event) string {
	if len(t.parts) == 1 && t.parts[0].field == fieldNone {
		return t.raw
	}
	if t.cache == nil {
		return t.render(e)
	}
	var k cacheKey
	for _, p := range t.parts {
		switch p.field {
		case fieldAggregateType:
			k.aggregateType = e.AggregateType
		case fieldEventType:
			k.eventType = e.EventType
		}
	}
	m := t.cache.m.Load()
	if m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	v := t.render(e)
	if m == nil || len(*m) < maxCached {
		t.cache.add(k, v)
	}
	return v
}

// add keeps v as the destination of k unless maxCached are kept.
func (c *cache) add(k cacheKey, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[cacheKey]string{}
	if old := c.m.Load(); old != nil {
		if len(*old) >= maxCached {
			return
		}
		m = maps.Clone(*old)
	}
	// The event's strings may share memory with the rest of its row.
	m[cacheKey{strings.Clone(k.aggregateType), strings.Clone(k.eventType)}] = v
	c.m.Store(&m)
}

// render builds the destination of e.
func (t Template) render(e *event.Event) string {
	var b strings.Builder
	b.Grow(len(t.raw) + len(e.AggregateType) + len(e.AggregateID))
	for _, p := range t.parts {
		switch p.field {
		case fieldNone:
			b.WriteString(p.lit)
		case fieldAggregateType:
			t.write(&b, e.AggregateType)
		case fieldEventType:
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

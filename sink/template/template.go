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
	"unicode/utf8"

	"github.com/outboxrelay/relay/event"
)

// Template is a destination template such as "outbox.{aggregate_type}".
// The placeholders {aggregate_type}, {event_type} and {aggregate_id} are
// replaced from the event; the sanitize function given to Parse maps each
// rune of a replaced value that the broker does not allow in a name, and
// may be nil (values are then written as they are).
//
// Different values give different names: a value that is empty, holds
// invalid UTF-8 or has a rune the sanitizer changes is written sanitized
// and followed by Hash of the value, and with a limit (see Limit) a value
// too long for the name is cut and followed by its Hash likewise. A value
// that needs neither is written as it is. Two values still meet only when
// their 32-bit hashes and their sanitized prefixes are equal.
//
// A template without {aggregate_id} keeps the destinations it rendered (at
// most maxCached), shared by its copies. A Template is safe for concurrent
// use.
type Template struct {
	raw      string
	sanitize func(rune) rune
	max      int    // longest name in bytes, 0 for no limit
	parts    []part // raw split into literals and placeholders
	cache    *cache // nil when the template uses {aggregate_id} or no placeholder
}

// HashLen is the length of what Hash returns.
const HashLen = 9

// Hash returns "_" and 8 lowercase hex digits of the 64-bit FNV-1a hash of
// v's bytes folded to 32 bits: the suffix that tells apart values a
// destination name cannot hold as they are.
func Hash(v string) string {
	h := uint64(14695981039346656037) // FNV-1a offset basis
	for i := range len(v) {
		h ^= uint64(v[i])
		h *= 1099511628211 // FNV prime
	}
	return fmt.Sprintf("_%08x", uint32(h^h>>32))
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

// Limit returns a copy of t whose names have at most max bytes when the
// literal text leaves room: when a name would be longer, each placeholder
// gets an even share of the bytes the literal text leaves, and a value
// longer than its share is cut (at a rune boundary) and followed by its
// Hash. A name is left longer than max when a share is shorter than
// HashLen+1 bytes. Call it before rendering; the copy keeps its own
// destinations.
func (t Template) Limit(max int) Template {
	t.max = max
	if t.cache != nil {
		t.cache = &cache{}
	}
	return t
}

// Fixed reports whether t has no placeholder: every event gets the same
// name.
func (t Template) Fixed() bool {
	return !slices.ContainsFunc(t.parts, func(p part) bool { return p.field != fieldNone })
}

// Raw returns the template text.
func (t Template) Raw() string { return t.raw }

// Render returns the destination of e. An empty value renders as Hash(""),
// that is "_" and 8 hex digits. It allocates only the result, nothing for a template without placeholders,
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

// render builds the destination of e, within t.max bytes when the literal
// text leaves each placeholder room for more than its Hash.
func (t Template) render(e *event.Event) string {
	name := t.build(e, 0)
	if t.max <= 0 || len(name) <= t.max {
		return name
	}
	lit, n := 0, 0
	for _, p := range t.parts {
		if p.field == fieldNone {
			lit += len(p.lit)
		} else {
			n++
		}
	}
	if share := (t.max - lit) / n; share > HashLen {
		return t.build(e, share)
	}
	return name
}

// build writes the destination of e, each value in at most share bytes
// when share is above 0.
func (t Template) build(e *event.Event, share int) string {
	var b strings.Builder
	b.Grow(len(t.raw) + len(e.AggregateType) + len(e.AggregateID))
	for _, p := range t.parts {
		switch p.field {
		case fieldNone:
			b.WriteString(p.lit)
		case fieldAggregateType:
			t.write(&b, e.AggregateType, share)
		case fieldEventType:
			t.write(&b, e.EventType, share)
		default:
			t.write(&b, e.AggregateID, share)
		}
	}
	return b.String()
}

// write appends v cleaned for the broker, followed by its Hash when
// cleaning changed it or when it is cut to fit share bytes (share > 0).
func (t Template) write(b *strings.Builder, v string, share int) {
	n, changed := t.measure(v)
	keep := n
	if share > 0 && n > share {
		changed = true
	}
	if changed && share > 0 {
		keep = min(n, share-HashLen)
	}
	if t.sanitize == nil {
		for keep < len(v) && keep > 0 && !utf8.RuneStart(v[keep]) {
			keep--
		}
		b.WriteString(v[:keep])
	} else {
		written := 0
		for _, r := range v {
			r = t.sanitize(r)
			if written += utf8.RuneLen(r); written > keep {
				break
			}
			b.WriteRune(r)
		}
	}
	if changed {
		b.WriteString(Hash(v))
	}
}

// measure returns the bytes v takes once cleaned, and whether cleaning
// changes it: an empty value, invalid UTF-8 (written as U+FFFD) or a rune
// the sanitizer maps to another.
func (t Template) measure(v string) (n int, changed bool) {
	if t.sanitize == nil {
		return len(v), v == ""
	}
	changed = v == "" || !utf8.ValidString(v)
	for _, r := range v {
		s := t.sanitize(r)
		changed = changed || s != r
		n += utf8.RuneLen(s)
	}
	return n, changed
}

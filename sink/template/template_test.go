package template

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
)

func TestTemplateRender(t *testing.T) {
	dots := func(r rune) rune {
		if r == '.' {
			return '_'
		}
		return r
	}
	e := &event.Event{AggregateType: "order.v2", EventType: "paid", AggregateID: "o-1"}
	for _, tc := range []struct{ tmpl, want string }{
		{"outbox.{aggregate_type}", "outbox.order_v2" + Hash("order.v2")},
		{"fixed", "fixed"},
		{"{aggregate_type}", "order_v2" + Hash("order.v2")},
		{"a.{event_type}.{aggregate_id}.z", "a.paid.o-1.z"},
		{"{aggregate_id}{aggregate_id}", "o-1o-1"},
	} {
		tp, err := Parse(tc.tmpl, dots)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.Render(e); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.tmpl, got, tc.want)
		}
	}
	tp, _ := Parse("x.{event_type}", nil)
	if got := tp.Render(&event.Event{}); got != "x."+Hash("") {
		t.Errorf("empty value: got %q, want x.%s", got, Hash(""))
	}
	for _, bad := range []string{"x.{nope}", "x.{aggregate_type"} {
		if _, err := Parse(bad, nil); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// TestTemplateDistinct renders values that the sanitizer maps to the same
// text: each gets a different name, while a value the sanitizer keeps is
// written as it is.
func TestTemplateDistinct(t *testing.T) {
	tp, err := Parse("outbox.{aggregate_type}", token)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, v := range []string{"order.*", "order.>", "order__", "a b", "a\tb", "a_b", "bad\xff", "bad\xfe", "bad\ufffd", "", "_"} {
		name := tp.Render(&event.Event{AggregateType: v})
		if prev, ok := seen[name]; ok {
			t.Errorf("%q and %q both render %q", prev, v, name)
		}
		seen[name] = v
	}
	if got := tp.Render(&event.Event{AggregateType: "order_v2-ü"}); got != "outbox.order_v2-ü" {
		t.Errorf("a clean value renders %q, want outbox.order_v2-ü", got)
	}
	if got, want := tp.Render(&event.Event{AggregateType: "order.*"}), "outbox.order__"+Hash("order.*"); got != want {
		t.Errorf("order.* renders %q, want %q", got, want)
	}
}

// TestTemplateLimit renders names longer than a template's limit: each
// value over its share of the bytes is cut at a rune boundary and followed
// by its hash, names within the limit are unchanged, and a template whose
// literal text leaves no room keeps the long name.
func TestTemplateLimit(t *testing.T) {
	tp, err := Parse("{aggregate_type}-{event_type}.fifo", token)
	if err != nil {
		t.Fatal(err)
	}
	tp = tp.Limit(80)
	long := strings.Repeat("q", 100)
	for _, tc := range []struct{ typ, evType, want string }{
		{"orders", "paid", "orders-paid.fifo"},
		{strings.Repeat("q", 73), "p", strings.Repeat("q", 73) + "-p.fifo"},
		{long, "paid", strings.Repeat("q", 28) + Hash(long) + "-paid.fifo"},
		{long, long + "x", strings.Repeat("q", 28) + Hash(long) + "-" + strings.Repeat("q", 28) + Hash(long+"x") + ".fifo"},
		{strings.Repeat("é", 50), "p", strings.Repeat("é", 14) + Hash(strings.Repeat("é", 50)) + "-p.fifo"},
	} {
		got := tp.Render(&event.Event{AggregateType: tc.typ, EventType: tc.evType})
		if got != tc.want || len(got) > 80 {
			t.Errorf("(%.10q, %.10q): got %q (%d bytes), want %q", tc.typ, tc.evType, got, len(got), tc.want)
		}
	}
	tight, _ := Parse(strings.Repeat("x", 75)+"{aggregate_type}", token)
	if got := tight.Limit(80).Render(&event.Event{AggregateType: long}); got != strings.Repeat("x", 75)+long {
		t.Errorf("no room: got %q, want the long name", got)
	}
}

// TestTemplateCache renders events of 300 aggregate and event types from
// several goroutines: every destination equals the uncached rendering, the
// template keeps at most maxCached of them, a kept one is rendered without
// allocating, and a template with {aggregate_id} keeps none.
func TestTemplateCache(t *testing.T) {
	upper := func(r rune) rune {
		if r == '.' {
			return '_'
		}
		return r
	}
	for _, raw := range []string{"outbox.{aggregate_type}", "x.{event_type}.{aggregate_type}", "{event_type}", "a.{aggregate_id}.{aggregate_type}"} {
		tp, err := Parse(raw, upper)
		if err != nil {
			t.Fatal(err)
		}
		copied := tp // copies share what the template keeps
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 1200 {
					e := &event.Event{AggregateType: fmt.Sprintf("t.%d", (i*7+g)%300), EventType: fmt.Sprintf("e%d", i%3), AggregateID: fmt.Sprint(i)}
					if i%50 == 0 {
						e.AggregateType = ""
					}
					if got, want := copied.Render(e), tp.render(e); got != want {
						t.Errorf("%s: rendered %q, want %q", raw, got, want)
						return
					}
				}
			}()
		}
		wg.Wait()
		if tp.cache == nil {
			if raw != "a.{aggregate_id}.{aggregate_type}" {
				t.Errorf("%s: keeps nothing", raw)
			}
			continue
		}
		if n := len(*tp.cache.m.Load()); n == 0 || n > maxCached {
			t.Errorf("%s: keeps %d destinations, want 1..%d", raw, n, maxCached)
		}
		fresh, _ := Parse(raw, upper)
		e := &event.Event{AggregateType: "t.1", EventType: "e1"}
		fresh.Render(e)
		if a := testing.AllocsPerRun(100, func() { fresh.Render(e) }); a != 0 {
			t.Errorf("%s: %v allocations to render a kept destination", raw, a)
		}
	}
}

// TestFullCacheRendersWithoutLock fills a template's cache and renders a
// new destination while the cache's lock is held: a full cache adds nothing,
// so the rendering does not wait for the lock.
func TestFullCacheRendersWithoutLock(t *testing.T) {
	tp, err := Parse("outbox.{aggregate_type}", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxCached {
		tp.Render(&event.Event{AggregateType: fmt.Sprint(i)})
	}
	tp.cache.mu.Lock()
	defer tp.cache.mu.Unlock()
	done := make(chan string, 1)
	go func() { done <- tp.Render(&event.Event{AggregateType: "new"}) }()
	select {
	case got := <-done:
		if got != "outbox.new" {
			t.Fatalf("rendered %q, want outbox.new", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("rendering with a full cache waits for the cache's lock")
	}
	if n := len(*tp.cache.m.Load()); n != maxCached {
		t.Fatalf("keeps %d destinations, want %d", n, maxCached)
	}
}

func BenchmarkTemplateRender(b *testing.B) {
	tp, _ := Parse("outbox.{aggregate_type}", func(r rune) rune { return r })
	e := &event.Event{AggregateType: "order", AggregateID: "order-1234"}
	b.ReportAllocs()
	for b.Loop() {
		_ = tp.Render(e)
	}
}

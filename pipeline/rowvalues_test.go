package pipeline

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
)

// FuzzRowValuesLogged publishes an event whose id, aggregate_type and
// aggregate_id hold the fuzzed bytes, repeat times over (10 MB in a seed),
// beside a plain one, with a sink that fails it permanently with an error
// quoting its values. Whatever the bytes, the pipeline neither panics nor
// stalls: the event is dead-lettered, its neighbour acknowledged, the
// metrics gather, and each line of its log (slog's text and JSON handlers
// as they are, without the relay's ReplaceAttr) is valid UTF-8 without
// control characters and a few kilobytes at most.
func FuzzRowValuesLogged(f *testing.F) {
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a\nb\r\x00", "\u202e\u009b", "é"} {
		f.Add(s, uint32(1))
	}
	f.Add("0123456789", uint32(1<<20))
	f.Add("\xa6", uint32(1<<12)) // escapes that grew a 2 KiB error fourfold
	f.Fuzz(func(t *testing.T, value string, repeat uint32) {
		long := strings.Repeat(value, int(repeat%(1<<20)+1))
		bad := &event.Event{ID: long, AggregateType: value, AggregateID: long, EventType: value, Position: 1}
		plain := mkEvent("plain", "plain")
		for _, json := range []bool{false, true} {
			snk := newFakeSink(func(e *event.Event, _ int) action {
				if e == bad {
					return action{err: fault.AsPermanent(fmt.Errorf("publish %s to outbox.%s: rejected", e.ID, e.AggregateType))}
				}
				return action{}
			})
			var logs testenv.SyncBuffer
			h := slog.Handler(slog.NewTextHandler(&logs, nil))
			if json {
				h = slog.NewJSONHandler(&logs, nil)
			}
			reg := prometheus.NewRegistry()
			opts := testOptions()
			opts.Logger, opts.Metrics = slog.New(h), NewMetrics(reg, "fake")
			source := src([][]*event.Event{{bad, plain}})
			r := start(t, source, snk, opts)
			waitFor(t, "the batch settled", 30*time.Second, func() bool { return source.countCompleted() == 1 })
			if err := r.stop(t, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if dead := source.checkSettledOnce(t); len(dead) != 1 || !snk.isAcked("plain") {
				t.Fatalf("%d dead letters, plain acknowledged %v", len(dead), snk.isAcked("plain"))
			}
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.SplitAfter(logs.String(), "\n") {
				if line == "" {
					continue
				}
				line = strings.TrimSuffix(line, "\n")
				if !utf8.ValidString(line) || strings.ContainsFunc(line, unicode.IsControl) || len(line) > 8000 {
					t.Fatalf("log line of %d bytes: %.300q", len(line), line)
				}
			}
		}
	})
}

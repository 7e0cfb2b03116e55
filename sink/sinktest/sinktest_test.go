package sinktest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

// mutantEnv names the environment variable that makes TestMemory run the
// suite against a memory broker with one deliberate bug.
const mutantEnv = "SINKTEST_MUTANT"

const memMaxBytes = 64 * 1024

var errDown = errors.New("memory broker is down")

// memRows drops the row headers every sink drops.
var memRows = sink.NewHeaderFilter(sink.KafkaRules, "", nil)

// memBroker is an in-memory broker that stores every message synchronously,
// deduplicates by message ID, and can be stopped. mutant names a bug it
// has on purpose, or is empty.
type memBroker struct {
	mutant string

	mu     sync.Mutex
	msgs   []sinktest.Message
	ids    map[string]bool
	down   bool
	stored int
}

func (b *memBroker) setDown(down bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = down
}

func (b *memBroker) received(scope string) []sinktest.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []sinktest.Message
	for _, m := range b.msgs {
		if strings.HasPrefix(m.Destination, scope+".") {
			out = append(out, m)
		}
	}
	return out
}

func (b *memBroker) store(dest string, e *event.Event) error {
	h := map[string][]string{}
	contract := func() {
		h["message_id"] = []string{e.ID}
		if b.mutant == "no_id" {
			delete(h, "message_id")
		}
		h["event_type"] = []string{e.EventType}
		h["aggregate_type"] = []string{e.AggregateType}
		h["aggregate_id"] = []string{e.AggregateID}
	}
	row := func() {
		if b.mutant == "drop_row" {
			return
		}
		for k, v := range e.Headers {
			if memRows.Reason(k) == "" || b.mutant == "row_wins" || b.mutant == "forward_reserved" {
				h[k] = []string{v}
			}
		}
	}
	if b.mutant == "row_wins" {
		contract()
		row()
	} else {
		row()
		contract()
	}
	if b.mutant == "trim_values" {
		for k, v := range h {
			h[k] = []string{strings.TrimSpace(v[0])}
		}
	}
	payload := bytes.Clone(e.Payload)
	if b.mutant == "mangle" {
		payload = bytes.ToValidUTF8(payload, []byte("?"))
	}
	m := sinktest.Message{Destination: dest, Key: e.Key(), Headers: h, Payload: payload}

	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.down && b.mutant == "permanent_down":
		return fault.AsPermanent(errDown)
	case b.down:
		return fault.AsUnavailable(errDown)
	case len(payload) > memMaxBytes && b.mutant == "transient_oversize":
		return errors.New("message too large")
	case len(payload) > memMaxBytes:
		return fault.AsPermanent(errors.New("message too large"))
	case b.ids[e.ID] && b.mutant != "no_dedupe":
		return nil // acknowledged as a duplicate
	}
	b.ids[e.ID] = true
	b.stored++
	switch {
	case b.mutant == "lose" && b.stored%500 == 0:
		return nil
	case b.mutant == "late_ack":
		go func() {
			time.Sleep(50 * time.Millisecond)
			b.mu.Lock()
			defer b.mu.Unlock()
			b.msgs = append(b.msgs, m)
		}()
		return nil
	case b.mutant == "reorder" && b.stored%7 == 0:
		// Put the message before the previous one of its aggregate.
		for i := len(b.msgs) - 1; i >= 0; i-- {
			if b.msgs[i].Key == m.Key && b.msgs[i].Destination == m.Destination {
				b.msgs = append(b.msgs[:i], append([]sinktest.Message{m}, b.msgs[i:]...)...)
				return nil
			}
		}
	}
	b.msgs = append(b.msgs, m)
	return nil
}

// memSink publishes to a memBroker.
type memSink struct {
	b     *memBroker
	tmpl  template.Template
	stall bool
}

func (s *memSink) Publish(ctx context.Context, batch []*event.Event) error {
	errs := make([]error, len(batch))
	failed := false
	if s.stall {
		<-ctx.Done()
		if s.b.mutant == "ack_stalled" {
			return nil
		}
		for i := range errs {
			errs[i] = fault.AsUnavailable(ctx.Err())
		}
		return &sink.BatchError{Errs: errs}
	}
	for i, e := range batch {
		if err := ctx.Err(); err != nil {
			errs[i] = fault.AsUnavailable(err)
			if s.b.mutant == "permanent_cancel" {
				errs[i] = fault.AsPermanent(err)
			}
		} else {
			errs[i] = s.b.store(s.tmpl.Render(e), e)
		}
		if errs[i] != nil {
			failed = true
			if s.b.mutant == "batch_fail" {
				return errs[i]
			}
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

func (s *memSink) Close() error { return nil }

func memSanitize(r rune) rune {
	if r == '.' || r == '*' || r == '>' || r == '/' || unicode.IsSpace(r) || unicode.IsControl(r) {
		return '_'
	}
	return r
}

func memHarness(t *testing.T, b *memBroker) sinktest.Harness {
	newSink := func(t *testing.T, tmpl string, stall bool) sink.Sink {
		sanitize := memSanitize
		if b.mutant == "no_sanitize" {
			sanitize = nil
		}
		tp, err := template.Parse(tmpl, sanitize)
		if err != nil {
			t.Fatal(err)
		}
		return &memSink{b: b, tmpl: tp, stall: stall}
	}
	return sinktest.Harness{
		New: func(t *testing.T, scope, tmpl string) sink.Sink { return newSink(t, tmpl, false) },
		Received: func(t *testing.T, scope string) []sinktest.Message {
			return b.received(scope)
		},
		Sanitize:        memSanitize,
		Stop:            func(t *testing.T) { b.setDown(true) },
		Start:           func(t *testing.T) { b.setDown(false) },
		NewStalled:      func(t *testing.T, scope, tmpl string) sink.Sink { return newSink(t, tmpl, true) },
		MaxMessageBytes: memMaxBytes,
		DeliveryTimeout: time.Second, // the broker stores synchronously
		Features:        sinktest.Features{DedupesByID: true, KeyedByAggregate: true},
	}
}

// TestMemory runs the suite against the memory broker, with the bug named
// by $SINKTEST_MUTANT if set.
func TestMemory(t *testing.T) {
	mutant := os.Getenv(mutantEnv)
	b := &memBroker{mutant: strings.TrimSuffix(mutant, "+skip"), ids: map[string]bool{}}
	h := memHarness(t, b)
	switch mutant {
	case "mangle+skip":
		h.Skip = map[string]string{"payload/binary": "this broker mangles binary payloads"}
	case "bad_skip":
		h.Skip = map[string]string{"payload/bianry": "misspelled"}
	}
	sinktest.Run(t, h)
}

// TestSuiteDetectsBrokenSinks runs the suite against memory brokers with
// one bug each, in a child process, and checks that the subtest meant to
// catch that bug fails. It also checks Harness.Skip.
func TestSuiteDetectsBrokenSinks(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("in a mutant run")
	}
	for _, c := range []struct {
		mutant string
		run    string // the subtest group to run
		want   string // in the output
		pass   bool   // the run must pass rather than fail
	}{
		{"no_id", "headers", "--- FAIL: TestMemory/headers/message_id ", false},
		{"drop_row", "headers", "--- FAIL: TestMemory/headers/row ", false},
		{"row_wins", "headers", "--- FAIL: TestMemory/headers/reserved ", false},
		{"forward_reserved", "headers", "--- FAIL: TestMemory/headers/dropped ", false},
		{"trim_values", "headers", "--- FAIL: TestMemory/headers/odd_values ", false},
		{"mangle", "payload", "--- FAIL: TestMemory/payload/binary ", false},
		{"reorder", "order", "--- FAIL: TestMemory/order ", false},
		{"lose", "order", "--- FAIL: TestMemory/order ", false},
		{"no_sanitize", "destination", "--- FAIL: TestMemory/destination/sanitize ", false},
		{"late_ack", "ack", "--- FAIL: TestMemory/ack ", false},
		{"no_dedupe", "duplicates", "--- FAIL: TestMemory/duplicates ", false},
		{"permanent_down", "outage", "--- FAIL: TestMemory/outage ", false},
		{"transient_oversize", "oversize", "--- FAIL: TestMemory/oversize ", false},
		{"batch_fail", "oversize", "--- FAIL: TestMemory/oversize ", false},
		{"permanent_cancel", "cancel", "--- FAIL: TestMemory/cancel/before ", false},
		{"ack_stalled", "cancel", "--- FAIL: TestMemory/cancel/stalled ", false},
		{"bad_skip", "payload", `Harness.Skip names "payload/bianry"`, false},
		{"mangle+skip", "payload", "--- SKIP: TestMemory/payload/binary ", true},
	} {
		t.Run(c.mutant, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemory$/^"+c.run+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+c.mutant)
			out, err := cmd.CombinedOutput()
			if c.pass && err != nil {
				t.Fatalf("%s: the suite failed: %v\n%s", c.mutant, err, out)
			}
			if !c.pass && err == nil {
				t.Fatalf("the suite passed a sink with bug %s:\n%s", c.mutant, out)
			}
			if !bytes.Contains(out, []byte(c.want)) {
				t.Fatalf("%s: the output lacks %q:\n%s", c.mutant, c.want, out)
			}
		})
	}
}

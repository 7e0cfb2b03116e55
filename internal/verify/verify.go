// Package verify checks a relay run against the contract's guarantees: it
// records what producers wrote and what consumers received, then reports
// loss, duplicates, foreign message ids and per-aggregate order breaks. The
// demo, the end-to-end tests and the fault-injection tests share it.
package verify

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Delivery is one message as a consumer saw it.
type Delivery struct {
	// MessageID is the message_id header (or attribute).
	MessageID string
	// AggregateID is the aggregate_id header.
	AggregateID string
	// Step is the producer's per-aggregate sequence number, from the payload.
	Step int
	// Problem describes anything wrong with the message itself (a header
	// missing or disagreeing with the payload); empty when fine.
	Problem string
}

// Log records writes and deliveries. It is safe for concurrent use.
type Log struct {
	mu         sync.Mutex
	written    map[string]written
	maybe      map[string]written
	deliveries []Delivery
}

type written struct {
	aggregate string
	step      int
}

// NewLog returns an empty log.
func NewLog() *Log { return &Log{written: map[string]written{}, maybe: map[string]written{}} }

// Written records that the producer committed event id as step of
// aggregate.
func (l *Log) Written(id, aggregate string, step int) {
	l.mu.Lock()
	l.written[id] = written{aggregate, step}
	l.mu.Unlock()
}

// MaybeWritten records an event whose commit outcome is unknown (the
// connection broke during COMMIT): it is not lost if never delivered, and
// not foreign if delivered.
func (l *Log) MaybeWritten(id, aggregate string, step int) {
	l.mu.Lock()
	l.maybe[id] = written{aggregate, step}
	l.mu.Unlock()
}

// Delivered records one delivery, in the order the consumer saw them.
func (l *Log) Delivered(d Delivery) {
	l.mu.Lock()
	l.deliveries = append(l.deliveries, d)
	l.mu.Unlock()
}

// Deliveries returns how many deliveries were recorded so far.
func (l *Log) Deliveries() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.deliveries)
}

// ReplaceDeliveries sets the deliveries to ds, for consumers that re-read
// everything the broker holds each time.
func (l *Log) ReplaceDeliveries(ds []Delivery) {
	l.mu.Lock()
	l.deliveries = ds
	l.mu.Unlock()
}

// Report is the result of Check.
type Report struct {
	Written, Delivered, Distinct, Duplicates int
	// Missing are written ids never delivered.
	Missing []string
	// Foreign are deliveries whose message_id was never written, or whose
	// aggregate or step disagree with what was written.
	Foreign []string
	// OrderBreaks describe first deliveries that came before an older event
	// of their aggregate.
	OrderBreaks []string
	// Problems are the deliveries' own problems.
	Problems []string
}

// Check compares deliveries with writes.
func (l *Log) Check() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Written: len(l.written), Delivered: len(l.deliveries)}
	seen := make(map[string]bool, len(l.written))
	last := map[string]int{}
	for _, d := range l.deliveries {
		if d.Problem != "" {
			r.Problems = append(r.Problems, d.MessageID+": "+d.Problem)
		}
		if seen[d.MessageID] {
			r.Duplicates++
			continue
		}
		seen[d.MessageID] = true
		w, ok := l.written[d.MessageID]
		if !ok {
			w, ok = l.maybe[d.MessageID]
		}
		if !ok || w.aggregate != d.AggregateID || w.step != d.Step {
			r.Foreign = append(r.Foreign, fmt.Sprintf("%s (aggregate %s step %d)", d.MessageID, d.AggregateID, d.Step))
			continue
		}
		if prev, ok := last[w.aggregate]; ok && w.step <= prev {
			r.OrderBreaks = append(r.OrderBreaks, fmt.Sprintf("%s: step %d after step %d", w.aggregate, w.step, prev))
		}
		last[w.aggregate] = max(last[w.aggregate], w.step)
	}
	r.Distinct = len(seen)
	for id := range l.written {
		if !seen[id] {
			r.Missing = append(r.Missing, id)
		}
	}
	return r
}

// Err returns nil when nothing was lost, foreign, out of order or
// malformed, and otherwise an error describing each kind of failure.
func (r Report) Err() error {
	var errs []error
	add := func(what string, items []string) {
		if len(items) > 0 {
			errs = append(errs, fmt.Errorf("%d %s, first: %s", len(items), what, strings.Join(items[:min(3, len(items))], "; ")))
		}
	}
	add("events lost", r.Missing)
	add("deliveries with an unknown or mismatched message_id", r.Foreign)
	add("per-aggregate order breaks", r.OrderBreaks)
	add("malformed deliveries", r.Problems)
	return errors.Join(errs...)
}

// String summarises the report in one line.
func (r Report) String() string {
	return fmt.Sprintf("%d written, %d delivered (%d distinct, %d duplicates), %d lost, %d order breaks",
		r.Written, r.Delivered, r.Distinct, r.Duplicates, len(r.Missing), len(r.OrderBreaks))
}

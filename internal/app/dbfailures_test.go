package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/event"
)

// scriptedSource returns its results in order from Next, then blocks.
type scriptedSource struct {
	next []func() (capture.Batch, error)
}

func (s *scriptedSource) Next(ctx context.Context) (capture.Batch, error) {
	if len(s.next) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f := s.next[0]
	s.next = s.next[1:]
	return f()
}

func (s *scriptedSource) Close() error { return nil }

// archiveResult is a batch whose Complete returns err.
type archiveResult struct{ err error }

func (b archiveResult) Events() []*event.Event                          { return nil }
func (b archiveResult) Complete(context.Context, capture.Outcome) error { return b.err }
func (b archiveResult) Abandon(context.Context)                         {}

// TestStaleStreamEndAfterArchiveRecovered replays what a wal run showed
// after a trigger refusing archives was dropped: of two batches of one
// stream, the later one's archive failed (and ended the stream), the
// earlier one's succeeded once the trigger was gone. The stream's end,
// returned by Next after the success, is the failure Complete already
// reported, not a new one: it must not log "archiving fails" again nor
// hold capture back.
func TestStaleStreamEndAfterArchiveRecovered(t *testing.T) {
	refused := errors.New("archive 3 rows: ERROR: archiving refused by a trigger (SQLSTATE P0001)")
	batch := func(err error) func() (capture.Batch, error) {
		return func() (capture.Batch, error) { return archiveResult{err}, nil }
	}
	src := &scriptedSource{next: []func() (capture.Batch, error){
		batch(nil), batch(refused),
		func() (capture.Batch, error) {
			return nil, fmt.Errorf("replication stream ended: %w: %w", capture.ErrArchive, refused)
		},
		batch(nil),
	}}
	var logs bytes.Buffer
	g := &dbFailures{Source: src, log: slog.New(slog.NewTextHandler(&logs, nil)),
		initial: time.Minute, max: time.Minute, fatalAfter: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next := func() capture.Batch {
		t.Helper()
		b, err := g.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		return b
	}
	earlier, later := next(), next()
	if later.Complete(ctx, capture.Outcome{}) == nil {
		t.Fatal("the later batch's archive did not fail")
	}
	if err := earlier.Complete(ctx, capture.Outcome{}); err != nil {
		t.Fatal(err)
	}
	next() // the stream's end comes first, then a batch of the new stream
	if n := strings.Count(logs.String(), "archiving fails"); n != 1 {
		t.Errorf("%d log lines \"archiving fails\", want 1:\n%s", n, logs.String())
	}
	if err := g.failing(); err != nil {
		t.Errorf("failing after an archive worked: %v", err)
	}
}

package kafka

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// lockedBuffer is a bytes.Buffer safe for concurrent use, for logs that
// franz-go's goroutines write to as well.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunBreakFailsTheRest publishes a run of five events of one aggregate
// and one event of another while the acknowledgement of the run's third
// record is altered the way a broken batch would show it (another producer
// epoch, an earlier offset, another partition): the first two events are
// published, the third fails as unavailable with errRunBroken, the fourth
// and fifth are held back behind it, the other aggregate's event is
// published, the break is logged as an error with its partition and
// offsets and counted in RunBreaks. Without checkRuns all six are
// reported published.
func TestRunBreakFailsTheRest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alter func(r *kgo.Record)
	}{
		{"epoch", func(r *kgo.Record) { r.ProducerEpoch++ }},
		{"producer", func(r *kgo.Record) { r.ProducerID++ }},
		{"offset", func(r *kgo.Record) { r.Offset -= 2 }},
		{"partition", func(r *kgo.Record) { r.Partition++ }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, kfake.SeedTopics(1, "t"))
			var logs lockedBuffer
			s := newSink(t, c.ListenAddrs(), "t", Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			batch := make([]*event.Event, 6)
			for i := range 5 {
				batch[i] = testEvent(i, "order", "hot")
			}
			batch[5] = testEvent(5, "order", "cold")
			third := batch[2].ID
			s.onAck = func(r *kgo.Record) {
				if id, _ := header(r, "message_id"); id == third {
					tc.alter(r)
				}
			}

			err := s.Publish(context.Background(), batch)
			for _, i := range []int{0, 1, 5} {
				if f := sink.Failed(err, i); f != nil {
					t.Errorf("event %d: %v, want published", i, f)
				}
			}
			if f := sink.Failed(err, 2); !errors.Is(f, errRunBroken) || fault.ClassOf(f) != fault.Unavailable {
				t.Errorf("event 2: %v (%s), want the run broken, unavailable", f, fault.ClassOf(f))
			}
			for _, i := range []int{3, 4} {
				if f := sink.Failed(err, i); !errors.Is(f, sink.ErrHeldBack) || fault.ClassOf(f) != fault.Unavailable {
					t.Errorf("event %d: %v, want held back behind the broken one", i, f)
				}
			}
			if n := s.RunBreaks(); n != 1 {
				t.Errorf("RunBreaks %d, want 1", n)
			}
			log := logs.String()
			for _, want := range []string{"level=ERROR", "did not store one publish's records of an aggregate in one batch", "topic=t", "partition=", "offset=", "previous_offset=", "producer_epoch="} {
				if !strings.Contains(log, want) {
					t.Errorf("the log lacks %q:\n%s", want, log)
				}
			}
		})
	}
}

// TestRunCheckPassesOneBatch publishes the runs of three aggregates,
// interleaved, in one call: their offsets are not consecutive, and the
// check lets every event pass.
func TestRunCheckPassesOneBatch(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	batch := testEvents(30, 3)
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	if n := s.RunBreaks(); n != 0 {
		t.Errorf("RunBreaks %d, want 0", n)
	}
}

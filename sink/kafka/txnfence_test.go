package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
)

// publishRecovered publishes batch on s the way the relay does: it
// recovers s before each attempt and tries again while the attempt fails
// as unavailable, for at most 30s.
func publishRecovered(t *testing.T, s *Sink, batch []*event.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for ctx.Err() == nil {
		if err = s.Recover(ctx, nil); err == nil {
			if err = publishAll(ctx, s, batch); err == nil {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("publish after recovery: %v", err)
}

// TestTransactionalFencedThenLeadsAgain is the wal A/B/A failover on one
// transactional id: relay A publishes, relay B takes over (fencing A),
// publishes and goes away without archiving, and A leads again. A
// publishes again, and an event of a batch A captured before B took over
// that B published meanwhile is not published twice.
func TestTransactionalFencedThenLeadsAgain(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	a := txnSink(t, brokers, "relay-aba")
	first := testEvents(10, 2)
	publishRecovered(t, a, first)

	b := txnSink(t, brokers, "relay-aba")
	stale := testEvent(100, "order", "s") // captured by A, then published by B
	publishRecovered(t, b, []*event.Event{stale, testEvent(101, "order", "b")})
	b.Close()

	again := []*event.Event{stale, testEvent(200, "order", "a"), testEvent(201, "order", "c")}
	publishRecovered(t, a, again)

	got := committedIDs(t, brokers)
	want := []string{stale.ID, testEvent(101, "order", "b").ID, again[1].ID, again[2].ID}
	for _, e := range first {
		want = append(want, e.ID)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("read_committed sees %d records %v, want each of %d once: %v", len(got), got, len(want), want)
	}
}

// TestTransactionalProgressBounded restarts a transactional sink many
// times, each run publishing events in transactions of their own and then
// archiving them: the progress records name only the events of the last
// run, not every event ever archived.
func TestTransactionalProgressBounded(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	var mu sync.Mutex
	outbox := map[string]bool{} // ids with an unarchived row
	unarchived := func(_ context.Context, ids []string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		var left []string
		for _, id := range ids {
			if outbox[id] {
				left = append(left, id)
			}
		}
		return left, nil
	}
	const runs, perRun = 8, 10
	for run := range runs {
		s := newSinkConfig(t, Config{Brokers: brokers, Topic: "outbox.{aggregate_type}", Transactional: true, TransactionalID: "relay-bounded"}, Options{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := s.Recover(ctx, unarchived); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range perRun {
			e := testEvent(run*perRun+i, "order", fmt.Sprint(i))
			mu.Lock()
			outbox[e.ID] = true
			mu.Unlock()
			if err := publishAll(ctx, s, []*event.Event{e}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, e.ID)
		}
		cancel()
		mu.Lock()
		for _, id := range ids {
			delete(outbox, id)
		}
		mu.Unlock()
		s.Archived(ids)
		s.Close()
	}
	last := txnSink(t, brokers, "relay-bounded") // keeps every id its records name
	if n := len(last.txn.where); n > perRun {
		t.Fatalf("after %d runs the progress records name %d events, want at most the %d of the last run", runs, n, perRun)
	}
}

// TestProgressTopicPolicy checks the progress topic: a missing one is
// created compacted with small segments; an existing one with
// cleanup.policy=delete, which would lose progress, is refused with an
// error naming the topic and the fix.
func TestProgressTopicPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topicConfigs := func(brokers []string) map[string]string {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, ProgressTopic)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, c := range rcs[0].Configs {
			m[c.Key] = c.MaybeValue()
		}
		return m
	}

	t.Run("created", func(t *testing.T) {
		brokers := newCluster(t).ListenAddrs()
		txnSink(t, brokers, "relay-policy")
		got := topicConfigs(brokers)
		for k, v := range progressConfigs {
			if got[k] != v {
				t.Errorf("progress topic %s=%q, want %q", k, got[k], v)
			}
		}
	})

	t.Run("delete refused", func(t *testing.T) {
		brokers := newCluster(t).ListenAddrs()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		policy := "delete"
		if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &policy}, ProgressTopic); err != nil {
			t.Fatal(err)
		}
		s := newSinkConfig(t, Config{Brokers: brokers, Topic: "outbox.x", Transactional: true, TransactionalID: "relay-policy"}, Options{})
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		defer rcancel()
		err = s.Recover(rctx, nil)
		if err == nil || fault.ClassOf(err) != fault.Permanent || errors.Is(err, context.DeadlineExceeded) ||
			!strings.Contains(err.Error(), ProgressTopic) || !strings.Contains(err.Error(), "cleanup.policy=compact") {
			t.Fatalf("recover on a progress topic with cleanup.policy=delete: %v (class %v), want a permanent error naming the topic and the fix",
				err, fault.ClassOf(err))
		}
		if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), "cleanup.policy=compact") {
			t.Fatalf("check on a progress topic with cleanup.policy=delete: %v, want the fix", err)
		}
	})
}

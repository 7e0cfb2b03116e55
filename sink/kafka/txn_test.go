package kafka

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// txnSink returns a transactional sink on brokers with transactional id id,
// recovered.
func txnSink(t *testing.T, brokers []string, id string) *Sink {
	t.Helper()
	s := newSinkConfig(t, Config{Brokers: brokers, Topic: "outbox.{aggregate_type}", Transactional: true, TransactionalID: id}, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// committedIDs returns the message ids a read_committed consumer sees on
// the outbox topics, in partition order.
func committedIDs(t *testing.T, brokers []string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := kafkatest.ReadCommitted(ctx, brokers, "outbox.")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		id, _ := r.Header("message_id")
		ids = append(ids, id)
	}
	return ids
}

// TestTransactionalPublishAndRecover publishes from concurrent callers in
// transactions: a read_committed consumer sees every event once. A sink
// started again with the same transactional id, as after a kill -9 before
// the rows were archived, recovers from the progress topic that those
// events are published, and forgets the ones reported archived.
func TestTransactionalPublishAndRecover(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	s := txnSink(t, brokers, "relay-test")
	evs := testEvents(400, 40)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for w := range 8 {
		wg.Go(func() { errs[w] = publishAll(context.Background(), s, evs[w*50:(w+1)*50]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	got := committedIDs(t, brokers)
	if len(got) != len(evs) {
		t.Fatalf("read_committed sees %d records, want %d", len(got), len(evs))
	}
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	s.Archived(ids[:100])
	// One more transaction records the archive in the slots it rewrites;
	// the others still name archived ids, which is only stale, not wrong.
	if err := s.Publish(context.Background(), []*event.Event{testEvent(1000, "order", "x")}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	again := txnSink(t, brokers, "relay-test")
	rec := again.Recorded(append(slices.Clone(ids[100:]), testEvent(1000, "order", "x").ID, testEvent(2000, "order", "y").ID))
	for i, ok := range rec[:len(rec)-1] {
		if !ok {
			t.Fatalf("published event %d not recorded after a restart", i)
		}
	}
	if rec[len(rec)-1] {
		t.Fatal("an event never published is recorded as published")
	}
}

// TestTransactionalZombieFenced starts a second sink with the same
// transactional id while the first still runs: the first is fenced, its
// later publishes fail and none of their records reaches a read_committed
// consumer.
func TestTransactionalZombieFenced(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	old := txnSink(t, brokers, "relay-zombie")
	if err := publishAll(context.Background(), old, testEvents(10, 2)); err != nil {
		t.Fatal(err)
	}
	txnSink(t, brokers, "relay-zombie")
	late := []*event.Event{testEvent(500, "order", "z")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := old.Publish(ctx, late); err == nil {
		t.Fatal("a fenced sink's publish succeeded")
	}
	if got := committedIDs(t, brokers); slices.Contains(got, late[0].ID) || len(got) != 10 {
		t.Fatalf("read_committed sees %d records (%v), want the 10 of before the fence", len(got), got)
	}
}

package kafka

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// describe returns the partition count and replication factor of topic, or
// -1, -1 when it does not exist.
func describe(t *testing.T, s *Sink, topic string) (int, int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cfg.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	d := details[topic]
	if d.Err != nil {
		return -1, -1
	}
	return len(d.Partitions), d.Partitions.NumReplicas()
}

func TestEnsureTopicsFixed(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(3))
	s := newSinkConfig(t, Config{Brokers: c.ListenAddrs(), Topic: "orders.events", Partitions: 6, ReplicationFactor: 3}, Options{})
	ctx := context.Background()
	if s.FixedTopic() != "orders.events" {
		t.Errorf("FixedTopic() = %q", s.FixedTopic())
	}

	err := s.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "orders.events does not exist") || !strings.Contains(err.Error(), "relay init") {
		t.Fatalf("Check before EnsureTopics = %v, want an error saying the topic is missing", err)
	}
	created, err := s.EnsureTopics(ctx)
	if err != nil || !slices.Equal(created, []string{"orders.events"}) {
		t.Fatalf("EnsureTopics = %v, %v; want [orders.events]", created, err)
	}
	if p, rf := describe(t, s, "orders.events"); p != 6 || rf != 3 {
		t.Errorf("created topic has %d partitions and %d replicas, want 6 and 3", p, rf)
	}
	created, err = s.EnsureTopics(ctx)
	if err != nil || len(created) != 0 {
		t.Fatalf("second EnsureTopics = %v, %v; want nothing created", created, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after EnsureTopics: %v", err)
	}
	if _, err := s.EnsureTopics(ctx, "bad topic"); err == nil {
		t.Error("EnsureTopics accepted an invalid name")
	}
}

// TestEnsureTopicsBrokerDefaults leaves partitions and replication factor
// to the broker.
func TestEnsureTopicsBrokerDefaults(t *testing.T) {
	c := newCluster(t, kfake.DefaultNumPartitions(5))
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	if _, err := s.EnsureTopics(context.Background(), "a", "b"); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"a", "b"} {
		if p, rf := describe(t, s, topic); p != 5 || rf != 1 {
			t.Errorf("%s: %d partitions and %d replicas, want the broker's 5 and 1", topic, p, rf)
		}
	}
}

// TestPublishCreatesTopics checks that the first publish to each topic of a
// template creates it with the configured settings, once, even from
// concurrent publishes and on a cluster that does not auto-create topics.
func TestPublishCreatesTopics(t *testing.T) {
	c := newCluster(t)
	s := newSinkConfig(t, Config{Brokers: c.ListenAddrs(), Topic: "ev.{aggregate_type}", Partitions: 2}, Options{})
	ctx := context.Background()
	if s.FixedTopic() != "" {
		t.Errorf("FixedTopic() = %q for a template", s.FixedTopic())
	}
	if created, err := s.EnsureTopics(ctx); err != nil || len(created) != 0 {
		t.Errorf("EnsureTopics on a template = %v, %v; want nothing", created, err)
	}
	if err := s.Check(ctx); err != nil {
		t.Errorf("Check on a template: %v", err)
	}
	if p, _ := describe(t, s, "ev.relay_check"); p != -1 {
		t.Error("Check created its probe topic")
	}

	var creates, describes atomic.Int32
	c.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		creates.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.DescribeConfigs), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		describes.Add(1)
		return nil, nil, false
	})
	done := make(chan error)
	for range 4 {
		go func() { done <- publishAll(ctx, s, testEvents(40, 8)) }()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := publishAll(ctx, s, testEvents(10, 3)); err != nil {
		t.Fatal(err)
	}
	if creates.Load() != 1 || describes.Load() != 1 {
		t.Errorf("%d CreateTopics and %d DescribeConfigs requests, want 1 of each", creates.Load(), describes.Load())
	}
	if p, _ := describe(t, s, "ev.order"); p != 2 {
		t.Errorf("ev.order has %d partitions, want 2", p)
	}
	if n := len(readTopics(t, c.ListenAddrs(), "ev.order")); n != 170 {
		t.Errorf("ev.order holds %d records, want 170", n)
	}
}

// TestPublishCreateDenied denies topic creation: the events fail as a
// failure of the destination with the fix, and succeed once the topic
// exists.
func TestPublishCreateDenied(t *testing.T) {
	c := newCluster(t)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.CreateTopics}, Err: kerr.TopicAuthorizationFailed, Count: -1})
	s := newSink(t, c.ListenAddrs(), "ev.{aggregate_type}", Options{})
	err := s.Publish(context.Background(), testEvents(3, 3))
	if got := sinktest.Classes(err, 3); !slices.Equal(got, []string{"unavailable", "unavailable", "unavailable"}) {
		t.Fatalf("classes %v, want unavailable (err %v)", got, err)
	}
	msg := sink.Failed(err, 0).Error()
	for _, want := range []string{"ev.order does not exist", "TOPIC_AUTHORIZATION_FAILED", "grant this principal CREATE"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	err = s.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "created on their first publish") || !strings.Contains(err.Error(), "grant this principal CREATE") {
		t.Errorf("Check = %v, want the creation problem and its fix", err)
	}
	h.Remove()
	if err := s.Publish(context.Background(), testEvents(3, 3)); err != nil {
		t.Fatalf("after creation was allowed: %v", err)
	}
}

func TestPublishInvalidReplicationFactor(t *testing.T) {
	c := newCluster(t)
	s := newSinkConfig(t, Config{Brokers: c.ListenAddrs(), Topic: "ev.{aggregate_type}", ReplicationFactor: 3}, Options{})
	err := s.Publish(context.Background(), testEvents(1, 1))
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" || !strings.Contains(err.Error(), "sink.kafka.replication_factor") {
		t.Fatalf("classes %v, err %v; want unavailable naming sink.kafka.replication_factor", got, err)
	}
	if err := s.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "sink.kafka.replication_factor") {
		t.Errorf("Check = %v, want it to name sink.kafka.replication_factor", err)
	}
	if _, err := s.EnsureTopics(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "INVALID_REPLICATION_FACTOR") {
		t.Errorf("EnsureTopics = %v, want INVALID_REPLICATION_FACTOR", err)
	}
}

// TestEnsureTopicsRace creates the same topic from several sinks at once.
func TestEnsureTopicsRace(t *testing.T) {
	c := newCluster(t)
	done := make(chan []string)
	for range 4 {
		s := newSink(t, c.ListenAddrs(), "shared", Options{})
		go func() {
			created, err := s.EnsureTopics(context.Background())
			if err != nil {
				t.Error(err)
			}
			done <- created
		}()
	}
	n := 0
	for range 4 {
		n += len(<-done)
	}
	if n != 1 {
		t.Errorf("%d sinks say they created the topic, want 1", n)
	}
}

func TestCheckUnreachable(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c.ListenAddrs(), "t", Options{})
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "check sink.kafka.brokers") {
		t.Fatalf("Check = %v, want an unreachable error with the fix", err)
	}
}

func TestTopicLimitFromConfig(t *testing.T) {
	c := newCluster(t)
	withTopicLimit(t, c, "small", 1, 5000)
	s := newSink(t, c.ListenAddrs(), "small", Options{})
	if _, err := s.EnsureTopics(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.maxMessageBytes("small"); got != 5000 {
		t.Errorf("limit %d, want the topic's 5000", got)
	}
	if got := s.maxMessageBytes("unknown"); got != defaultMaxMessageBytes {
		t.Errorf("limit of an unknown topic %d, want %d", got, defaultMaxMessageBytes)
	}
}

// TestPublishRecreatesDeletedTopic deletes a topic the sink created: the
// publishes that find it gone fail as transient, and a later one creates it
// again.
func TestPublishRecreatesDeletedTopic(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c.ListenAddrs(), "ev.{aggregate_type}", Options{AckTimeout: 2 * time.Second})
	ctx := context.Background()
	if err := s.Publish(ctx, testEvents(3, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.adm.DeleteTopic(ctx, "ev.order"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for attempt := 0; ; attempt++ {
		err := s.Publish(ctx, testEvents(3, 3))
		if err == nil {
			t.Logf("published again after %d failed attempts, %v", attempt, time.Since(start).Round(time.Millisecond))
			break
		}
		t.Logf("attempt %d: %v", attempt, sink.Failed(err, 0))
		if got := sinktest.Classes(err, 3); slices.Contains(got, "permanent") {
			t.Fatalf("classes %v", got)
		}
		if attempt == 5 {
			t.Fatal("the topic was not created again")
		}
	}
	if p, _ := describe(t, s, "ev.order"); p < 1 {
		t.Error("ev.order does not exist")
	}
}

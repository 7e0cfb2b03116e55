package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
)

// topicState is a topic's preparation: done is closed when it finished,
// and err then tells whether it failed. A failed preparation is forgotten,
// so the next publish to the topic tries again.
type topicState struct {
	done chan struct{}
	err  error
}

// EnsureTopics creates those of names that do not exist, with the
// configured partitions and replication factor, and returns the ones it
// created. Without names it ensures the fixed topic of the template, and
// does nothing for a template with placeholders, whose topics the first
// publish to each creates. It never changes an existing topic, and is safe
// to call from several relays at once.
func (s *Sink) EnsureTopics(ctx context.Context, names ...string) ([]string, error) {
	if len(names) == 0 && s.fixed {
		names = []string{s.cfg.Topic}
	}
	var created []string
	for _, name := range names {
		if err := destname.KafkaTopic(name); err != nil {
			return created, err
		}
		made, err := s.prepare(ctx, name)
		if err != nil {
			return created, err
		}
		if made {
			created = append(created, name)
		}
	}
	return created, nil
}

// ready prepares topic once; concurrent callers wait for one preparation.
func (s *Sink) ready(ctx context.Context, topic string) error {
	s.mu.Lock()
	st := s.topics[topic]
	if st == nil {
		st = &topicState{done: make(chan struct{})}
		s.topics[topic] = st
		s.mu.Unlock()
		_, st.err = s.prepare(ctx, topic)
		if st.err != nil {
			s.mu.Lock()
			delete(s.topics, topic)
			s.mu.Unlock()
		}
		close(st.done)
		return st.err
	}
	s.mu.Unlock()
	select {
	case <-st.done:
		return st.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// forget handles a topic that was deleted after it was prepared: it drops
// the preparation, so that the next publish creates the topic again, and
// purges the topic from the client, which otherwise refuses to produce to a
// new topic of the same name. Records of the topic still buffered fail and
// are retried by the pipeline.
func (s *Sink) forget(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.topics[topic]
	if st == nil {
		return
	}
	select {
	case <-st.done:
		delete(s.topics, topic)
		s.limits.Delete(topic)
		s.cl.PurgeTopicsFromProducing(topic)
		if s.txn != nil {
			if cl := s.txn.producer(); cl != nil {
				cl.PurgeTopicsFromProducing(topic)
			}
		}
		s.opts.Logger.Warn("kafka topic vanished; it is created again on the next publish", "topic", topic)
	default: // being prepared right now
	}
}

// prepare makes sure topic exists, creating it when it does not, and
// records its max.message.bytes. It reports whether it created the topic.
// Its errors are classified for Publish.
func (s *Sink) prepare(ctx context.Context, topic string) (bool, error) {
	code, err := s.metadata(ctx, topic)
	if err != nil {
		return false, s.requestError("read metadata of topic "+topic, err)
	}
	created := false
	switch err := kerr.ErrorForCode(code); {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		if created, err = s.create(ctx, topic); err != nil {
			return false, err
		}
	case err != nil:
		return false, s.topicError(topic, err)
	}
	if _, known := s.limits.Load(topic); !known {
		s.limits.Store(topic, s.readLimit(ctx, topic))
	}
	return created, nil
}

// metadata asks a broker for the metadata of topic, or of no topic when
// topic is empty, and returns the topic's error code. It bypasses the
// client's metadata cache (which kadm uses), so that a topic created a
// moment ago is seen, and never asks the broker to auto-create the topic,
// which would ignore sink.kafka.partitions and replication_factor.
func (s *Sink) metadata(ctx context.Context, topic string) (int16, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	req.Topics = []kmsg.MetadataRequestTopic{}
	if topic == "" {
		_, err := req.RequestWith(ctx, s.cl)
		return 0, err
	}
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		return 0, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			return t.ErrorCode, nil
		}
	}
	return kerr.UnknownTopicOrPartition.Code, nil
}

// create creates topic; another relay creating it first is no error.
func (s *Sink) create(ctx context.Context, topic string) (bool, error) {
	partitions, replication := s.creation()
	return s.createWith(ctx, topic, partitions, replication, nil)
}

// createWith creates topic with partitions, replication and configs;
// another relay creating it first is no error.
func (s *Sink) createWith(ctx context.Context, topic string, partitions int32, replication int16, configs map[string]*string) (bool, error) {
	resp, err := s.adm.CreateTopic(ctx, partitions, replication, configs, topic)
	switch {
	case errors.Is(err, kerr.TopicAlreadyExists):
		return false, nil
	case err != nil && resp.Topic == "":
		return false, s.requestError("create topic "+topic, err)
	case err != nil:
		return false, s.createError(topic, err, resp.ErrMessage)
	}
	if v, ok := resp.Configs["max.message.bytes"]; ok {
		if n, err := strconv.ParseInt(v.MaybeValue(), 10, 32); err == nil && n > 0 {
			s.limits.Store(topic, int32(n))
		}
	}
	s.opts.Logger.Info("created kafka topic", "topic", topic,
		"partitions", resp.NumPartitions, "replication_factor", resp.ReplicationFactor)
	return true, nil
}

// creation returns the partitions and replication factor of new topics;
// -1 asks the broker for its default (Kafka 2.4 and later).
func (s *Sink) creation() (int32, int16) {
	partitions, replication := int32(-1), int16(-1)
	if s.cfg.Partitions > 0 {
		partitions = int32(s.cfg.Partitions)
	}
	if s.cfg.ReplicationFactor > 0 {
		replication = int16(s.cfg.ReplicationFactor)
	}
	return partitions, replication
}

// readLimit returns topic's max.message.bytes, or the default when the
// config cannot be read (for example without DESCRIBE_CONFIGS permission).
func (s *Sink) readLimit(ctx context.Context, topic string) int32 {
	rcs, err := s.adm.DescribeTopicConfigs(ctx, topic)
	if err == nil {
		var rc kadm.ResourceConfig
		if rc, err = rcs.On(topic, nil); err == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" {
					if n, err := strconv.ParseInt(c.MaybeValue(), 10, 32); err == nil && n > 0 {
						return int32(n)
					}
				}
			}
		} else if err == nil {
			err = rc.Err
		}
	}
	s.opts.Logger.Debug("kafka: cannot read max.message.bytes, assuming the default",
		"topic", topic, "default", defaultMaxMessageBytes, "err", err)
	return defaultMaxMessageBytes
}

// maxMessageBytes is the client's batch size limit for topic: its
// max.message.bytes as read by prepare.
func (s *Sink) maxMessageBytes(topic string) int32 {
	if v, ok := s.limits.Load(topic); ok {
		return v.(int32)
	}
	return defaultMaxMessageBytes
}

// requestError classifies a request that failed as a whole.
func (s *Sink) requestError(what string, err error) error {
	err = fmt.Errorf("%s on %s: %w", what, s.brokers(), s.explain(err))
	if isAuthError(err) {
		return fault.AsUnavailable(fmt.Errorf("%w; check sink.kafka.tls and sink.kafka.sasl", err))
	}
	return classify(err)
}

// topicError classifies a topic's metadata error.
func (s *Sink) topicError(topic string, err error) error {
	err = fmt.Errorf("topic %s: %w", topic, err)
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return fault.AsUnavailable(fmt.Errorf("%w; grant this principal DESCRIBE and WRITE on the topic", err))
	}
	return classify(err)
}

// createError explains a failed topic creation. The event is not at fault:
// the topic is missing, so the error is fault.Unavailable and the events are
// held until the topic exists. Only an invalid topic name, which can never
// exist, is permanent.
func (s *Sink) createError(topic string, err error, detail string) error {
	partitions, replication := s.creation()
	what := fmt.Sprintf("topic %s does not exist and creating it (partitions %s, replication factor %s) failed: %v",
		topic, orBrokerDefault(partitions), orBrokerDefault(int32(replication)), err)
	if detail != "" && !strings.Contains(err.Error(), detail) {
		what += " (" + detail + ")"
	}
	var fix string
	switch {
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		fix = "create the topic, or grant this principal CREATE on it (or on the cluster)"
	case errors.Is(err, kerr.InvalidReplicationFactor):
		fix = "set sink.kafka.replication_factor to at most the number of brokers"
	case errors.Is(err, kerr.InvalidPartitions):
		fix = "set sink.kafka.partitions to a valid count"
	case errors.Is(err, kerr.UnsupportedVersion), errors.Is(err, kerr.InvalidRequest):
		fix = "brokers before Kafka 2.4 need explicit sink.kafka.partitions and sink.kafka.replication_factor"
	case errors.Is(err, kerr.PolicyViolation):
		fix = "create the topic, or change sink.kafka.partitions or replication_factor to satisfy the cluster's topic policy"
	case errors.Is(err, kerr.InvalidTopicException):
		return fault.AsPermanent(errors.New(what))
	default:
		return fault.AsUnavailable(fmt.Errorf("%s: %w", what, err))
	}
	return fault.AsUnavailable(fmt.Errorf("%s; %s", what, fix))
}

func orBrokerDefault(n int32) string {
	if n < 0 {
		return "broker default"
	}
	return strconv.Itoa(int(n))
}

// Check verifies that a broker answers, that the idempotent producer can
// start, and that the fixed topic exists; for a template with placeholders
// it asks the brokers to validate creating a topic from it, since the
// first publish to each topic creates it. With transactions it also checks
// the cleanup.policy of an existing progress topic (see
// EnsureProgressTopic); it never starts a transactional producer, which
// would fence the running relay. It gives up after 15s unless ctx ends
// sooner. Its errors say what to change.
func (s *Sink) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if _, err := s.metadata(ctx, ""); err != nil {
		return fmt.Errorf("kafka %s: %w; check sink.kafka.brokers, sink.kafka.tls and sink.kafka.sasl, and that the brokers run",
			s.brokers(), s.explain(err))
	}
	var errs []error
	if _, _, err := s.cl.ProducerID(ctx); err != nil {
		errs = append(errs, fmt.Errorf("kafka: the idempotent producer cannot start: %w; on Kafka before 3.0 grant this principal IDEMPOTENT_WRITE on the cluster", err))
	}
	if s.fixed {
		errs = append(errs, s.checkTopic(ctx, s.cfg.Topic))
	} else {
		errs = append(errs, s.checkCreate(ctx))
	}
	if s.txn != nil {
		if code, err := s.metadata(ctx, ProgressTopic); err == nil && code == 0 {
			errs = append(errs, s.checkProgressTopic(ctx))
		}
	}
	return errors.Join(errs...)
}

func (s *Sink) checkTopic(ctx context.Context, topic string) error {
	code, err := s.metadata(ctx, topic)
	if err != nil {
		return fmt.Errorf("kafka topic %s: %w", topic, err)
	}
	switch err := kerr.ErrorForCode(code); {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("kafka topic %s does not exist; run `relay init` to create it (the first publish creates it too, if this principal may), or set sink.kafka.topic to an existing topic", topic)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return fmt.Errorf("kafka topic %s: %w; grant this principal DESCRIBE and WRITE on it", topic, err)
	case err != nil:
		return fmt.Errorf("kafka topic %s: %w", topic, err)
	}
	return nil
}

// checkCreate validates, without creating anything, that a topic rendered
// from the template can be created.
func (s *Sink) checkCreate(ctx context.Context) error {
	probe := strings.NewReplacer("{aggregate_type}", "relay_check", "{event_type}", "relay_check", "{aggregate_id}", "relay_check").Replace(s.cfg.Topic)
	partitions, replication := s.creation()
	resp, err := s.adm.ValidateCreateTopics(ctx, partitions, replication, nil, probe)
	if err == nil {
		err = resp.Error()
	}
	if err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
		return nil
	}
	return fmt.Errorf("kafka topics of %s are created on their first publish, but validating the creation of %s failed: %w; %s",
		s.cfg.Topic, probe, err, createFix(err))
}

func createFix(err error) string {
	switch {
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return "grant this principal CREATE on the cluster (or on the template's topic prefix), create every topic beforehand, or use a fixed sink.kafka.topic and run `relay init`"
	case errors.Is(err, kerr.InvalidReplicationFactor):
		return "set sink.kafka.replication_factor to at most the number of brokers"
	case errors.Is(err, kerr.UnsupportedVersion), errors.Is(err, kerr.InvalidRequest):
		return "brokers before Kafka 2.4 need explicit sink.kafka.partitions and sink.kafka.replication_factor"
	}
	return "check sink.kafka.partitions and sink.kafka.replication_factor against the cluster's topic policy"
}

// DestinationOf returns the topic of e.
func (s *Sink) DestinationOf(e *event.Event) string { return s.topicOf(e) }

// RowChosen implements sink.RowRouted: true when the topic template has a
// placeholder.
func (s *Sink) RowChosen() bool { return !s.fixed }

// Probe sends a metadata request: for sink.Broker, of no topic (a broker
// answers and accepts the credentials); for a topic, of that topic, which
// must exist and be visible to this principal. Its errors are classified
// like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	topic := dest
	if dest == sink.Broker {
		topic = ""
	}
	code, err := s.metadata(ctx, topic)
	if err != nil {
		return s.requestError("metadata", err)
	}
	if err := kerr.ErrorForCode(code); err != nil {
		return s.topicError(topic, err)
	}
	return nil
}

var (
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

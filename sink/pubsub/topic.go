package pubsub

import (
	"context"
	"errors"
	"fmt"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/sink"
)

// topicName returns the full resource name of topic ID id.
func (s *Sink) topicName(id string) string {
	return "projects/" + s.cfg.ProjectID + "/topics/" + id
}

// FixedTopic returns the topic ID of a template without placeholders, or "".
func (s *Sink) FixedTopic() string {
	if s.tmpl.Fixed() {
		return s.cfg.Topic
	}
	return ""
}

// Check verifies that the sink can publish, with errors that say what to
// change: for a fixed topic, that it exists and the credentials may read
// it (GetTopic); for a template, that the project's topics can be listed
// (ListTopics), or that Pub/Sub at least answered when the credentials may
// not list them. Check never creates anything.
func (s *Sink) Check(ctx context.Context) error {
	if t := s.FixedTopic(); t != "" {
		if _, err := s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: s.topicName(t)}); err != nil {
			return s.explain(err, t)
		}
		return nil
	}
	if err := s.listTopics(ctx); err != nil && status.Code(err) != codes.PermissionDenied {
		return s.explain(err, "")
	}
	return nil
}

// listTopics asks for one topic of the project.
func (s *Sink) listTopics(ctx context.Context) error {
	it := s.client.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/" + s.cfg.ProjectID, PageSize: 1})
	if _, err := it.Next(); err != nil && !errors.Is(err, iterator.Done) {
		return err
	}
	return nil
}

// explain adds the likely fix to an error of Check or EnsureTopic.
func (s *Sink) explain(err error, topic string) error {
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("pubsub topic %s does not exist in project %s: %w; run relay init, or gcloud pubsub topics create %s --project %s", topic, s.cfg.ProjectID, err, topic, s.cfg.ProjectID)
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("pubsub: %w; %s", err, credentialsHint)
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("pubsub: %w; check that Pub/Sub (or PUBSUB_EMULATOR_HOST, sink.pubsub.endpoint) is reachable", err)
	}
	return fmt.Errorf("pubsub: %w", err)
}

// EnsureTopic creates the fixed topic when it does not exist and reports
// whether it did; a template's topics cannot be known ahead, and it
// returns false, nil for them.
func (s *Sink) EnsureTopic(ctx context.Context) (created bool, err error) {
	t := s.FixedTopic()
	if t == "" {
		return false, nil
	}
	_, err = s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: s.topicName(t)})
	if status.Code(err) != codes.NotFound {
		if err != nil {
			return false, s.explain(err, t)
		}
		return false, nil
	}
	_, err = s.client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: s.topicName(t)})
	switch status.Code(err) {
	case codes.OK:
		return true, nil
	case codes.AlreadyExists:
		return false, nil
	}
	return false, fmt.Errorf("create pubsub topic %s: %w", t, s.explain(err, t))
}

// DestinationOf returns e's topic ID.
func (s *Sink) DestinationOf(e *event.Event) string { return s.tmpl.Render(e) }

// RowChosen implements sink.RowRouted: true when sink.pubsub.topic has a
// placeholder.
func (s *Sink) RowChosen() bool { return !s.tmpl.Fixed() }

// Probe checks without publishing: for a topic ID, or sink.Broker with a
// fixed topic, that the topic exists (GetTopic); for sink.Broker with a
// template, that Pub/Sub answers and accepts the credentials (ListTopics).
// Credentials that may publish but not read topics (PermissionDenied)
// pass: the next publish tells. Its errors are classified like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.PublishTimeout)
	defer cancel()
	var err error
	switch {
	case dest != sink.Broker:
		_, err = s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: s.topicName(dest)})
	case s.FixedTopic() != "":
		_, err = s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: s.topicName(s.FixedTopic())})
	default:
		err = s.listTopics(ctx)
	}
	if err == nil || status.Code(err) == codes.PermissionDenied {
		return nil
	}
	return fmt.Errorf("pubsub probe %s: %w", dest, s.classify(ctx, err))
}

var (
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

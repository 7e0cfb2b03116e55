package sqs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
)

// resolution is a queue name's URL, or the pending lookup of it.
type resolution struct {
	done chan struct{} // closed when ref and err are set
	ref  queueRef
	err  error
}

// queueName returns the name of e's queue. A rendered name that is not a
// valid queue name (too long) fails as fault.Permanent: no such queue can
// exist.
func (s *Sink) queueName(e *event.Event) (string, error) {
	if s.fixed.url != "" {
		return s.fixed.name, nil
	}
	name := s.tmpl.Render(e)
	if err := destname.SQSQueue(name); err != nil {
		return "", fault.AsPermanent(fmt.Errorf("template %q: %w", s.cfg.Queue, err))
	}
	return name, nil
}

// resolve returns the queue named name: the fixed queue, or the URL
// GetQueueUrl returns for the name, cached after the first success.
// Concurrent calls for one name share one lookup; a failed lookup is not
// cached.
func (s *Sink) resolve(ctx context.Context, name string) (queueRef, error) {
	if s.fixed.url != "" {
		return s.fixed, nil
	}
	s.mu.Lock()
	r, ok := s.urls[name]
	if !ok {
		r = &resolution{done: make(chan struct{})}
		s.urls[name] = r
	}
	s.mu.Unlock()
	if ok {
		select {
		case <-r.done:
			return r.ref, r.err
		case <-ctx.Done():
			return queueRef{}, s.classify(ctx, ctx.Err())
		}
	}
	r.ref, r.err = s.lookup(ctx, name)
	if r.err != nil {
		s.mu.Lock()
		if s.urls[name] == r {
			delete(s.urls, name)
		}
		s.mu.Unlock()
	}
	close(r.done)
	return r.ref, r.err
}

// lookup asks SQS for the URL of queue name.
func (s *Sink) lookup(ctx context.Context, name string) (queueRef, error) {
	rctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	out, err := s.client.GetQueueUrl(rctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		return queueRef{}, fmt.Errorf("GetQueueUrl %s: %w", name, s.classify(ctx, err))
	}
	ref := queueRef{name: name, url: aws.ToString(out.QueueUrl), fifo: strings.HasSuffix(name, fifoSuffix)}
	s.opts.Logger.Debug("resolved sqs queue", "queue", rowtext.Value(name), "url", rowtext.Value(ref.url))
	return ref, nil
}

// forget drops the cached URL of queue name, after SQS said the queue does
// not exist, so the next publish looks it up again.
func (s *Sink) forget(name string) {
	if s.fixed.url != "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.urls[name]; ok {
		select {
		case <-r.done:
			delete(s.urls, name)
		default: // a lookup is under way
		}
	}
}

// Check verifies that the sink can publish, with errors that say what to
// change. It first obtains credentials. For sink.sqs.queue_url, or a queue
// template without placeholders, it then reads the queue's attributes
// (GetQueueAttributes) and checks that the queue's kind matches its name.
// A template with placeholders names queues that only the events reveal, so
// Check lists the queues whose names start with the template's literal
// prefix (ListQueues) and fails when there is none; when the credentials
// may not list queues, it only checks that SQS answered. Check never
// creates anything.
func (s *Sink) Check(ctx context.Context) error {
	if s.creds == nil {
		return errors.New("no AWS credentials provider; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
	}
	if _, err := s.creds.Retrieve(ctx); err != nil {
		return fmt.Errorf("no usable AWS credentials (%v); %s", err, s.credentialsHint())
	}
	if s.fixed.url == "" && strings.Contains(s.cfg.Queue, "{") {
		return s.checkTemplate(ctx)
	}
	ref := s.fixed
	if ref.url == "" {
		var err error
		ref, err = s.resolve(ctx, s.cfg.Queue)
		if err != nil {
			return s.explain(err, s.cfg.Queue)
		}
	}
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(ref.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn, types.QueueAttributeNameFifoQueue},
	})
	if err != nil {
		return s.explain(fmt.Errorf("GetQueueAttributes %s: %w", ref.url, err), ref.name)
	}
	if fifo := out.Attributes[string(types.QueueAttributeNameFifoQueue)] == "true"; fifo != ref.fifo {
		return fmt.Errorf("sqs queue %s: FifoQueue is %v but its name %s ends in .fifo only for FIFO queues; check sink.sqs.queue_url", ref.url, fifo, ref.name)
	}
	return nil
}

// credentialsHint says how to fix a failure to obtain credentials.
func (s *Sink) credentialsHint() string {
	chain := "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with a web identity (AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE) or an instance or task role"
	if s.cfg.RoleARN == "" {
		return chain
	}
	return "check that the role " + s.cfg.RoleARN + " (sink.sqs.role_arn) trusts the relay's credentials for sts:AssumeRole (and its sts:ExternalId condition matches sink.sqs.external_id), and that those credentials exist: " + chain
}

// checkTemplate checks a queue template with placeholders.
func (s *Sink) checkTemplate(ctx context.Context) error {
	prefix := s.cfg.Queue[:strings.IndexByte(s.cfg.Queue, '{')]
	in := &sqs.ListQueuesInput{MaxResults: aws.Int32(1000)}
	if prefix != "" {
		in.QueueNamePrefix = aws.String(prefix)
	}
	out, err := s.client.ListQueues(ctx, in)
	switch {
	case err != nil && strings.Contains(apiCode(err), "AccessDenied"):
		return nil // SQS answered and knows the credentials; they may not list queues.
	case err != nil:
		return s.explain(fmt.Errorf("ListQueues: %w", err), "")
	case len(out.QueueUrls) == 0 && prefix != "":
		return fmt.Errorf("no sqs queue name starts with %q (from sink.sqs.queue %q); create the queues the template names (the relay never creates queues), or fix sink.sqs.queue; events for a missing queue are held (never dead-lettered) until it exists",
			prefix, s.cfg.Queue)
	}
	return nil
}

// explain adds the likely fix to an error of Check.
func (s *Sink) explain(err error, queue string) error {
	code := apiCode(err)
	var credErr *credentialsError
	switch {
	case noQueue[code]:
		create := "aws sqs create-queue --queue-name " + queue
		if strings.HasSuffix(queue, fifoSuffix) {
			create += " --attributes FifoQueue=true"
		}
		return fmt.Errorf("sqs queue %s does not exist: %w; create it (%s) or fix sink.sqs.queue / sink.sqs.queue_url", queue, err, create)
	case strings.Contains(code, "AccessDenied"):
		return fmt.Errorf("%w; grant these credentials sqs:GetQueueUrl, sqs:GetQueueAttributes and sqs:SendMessage on the queue", err)
	case errors.As(err, &credErr), unavailable[code]:
		return fmt.Errorf("%w; check the AWS credentials and sink.sqs.region", err)
	case code == "" && isNetwork(err):
		return fmt.Errorf("%w; check sink.sqs.endpoint and sink.sqs.region, and that the SQS endpoint is reachable", err)
	}
	return err
}

// DestinationOf returns the name of e's queue.
func (s *Sink) DestinationOf(e *event.Event) string {
	if name, err := s.queueName(e); err == nil {
		return name
	}
	return s.tmpl.Render(e)
}

// RowChosen implements sink.RowRouted: true when sink.sqs.queue has a
// placeholder.
func (s *Sink) RowChosen() bool { return s.fixed.url == "" && !s.tmpl.Fixed() }

// Probe checks without sending: for sink.Broker, that SQS answers and
// accepts the credentials (GetQueueAttributes of the fixed queue, or
// ListQueues for a template); for a queue name, that the queue exists and
// its attributes can be read. Its errors are classified like Publish's.
func (s *Sink) Probe(ctx context.Context, dest string) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if dest == sink.Broker && s.fixed.url == "" {
		if _, err := s.client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
			return fmt.Errorf("sqs ListQueues: %w", s.classify(ctx, err))
		}
		return nil
	}
	q := s.fixed
	if dest != sink.Broker {
		var err error
		if q, err = s.resolve(ctx, dest); err != nil {
			return err
		}
	}
	_, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		if noQueue[apiCode(err)] {
			s.forget(q.name)
		}
		return fmt.Errorf("sqs GetQueueAttributes %s: %w", q.name, s.classify(ctx, err))
	}
	return nil
}

var (
	_ sink.Destinations = (*Sink)(nil)
	_ sink.RowRouted    = (*Sink)(nil)
)

package pubsub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/sink"
)

// Pub/Sub's limits on attributes and ordering keys.
const (
	maxAttributes     = 100
	maxAttrNameBytes  = 256
	maxAttrValueBytes = 1024
	maxOrderingKey    = 1024
)

// Attribute names the sink sets.
const (
	attrMessageID     = "message_id"
	attrEventType     = "event_type"
	attrAggregateType = "aggregate_type"
	attrAggregateID   = "aggregate_id"
	attrContentType   = "content_type"
)

// call is one Publish call's state, indexed like its batch.
type call struct {
	refs    []keyRef
	errs    []error
	results []*pubsub.PublishResult
	sent    map[keyRef]int        // messages handed to the client, by key
	pubs    map[string]*publisher // publishers acquired, by topic
}

// Publish sends every event of batch and returns nil when Pub/Sub returned
// a message id for each, or a *sink.BatchError saying which failed and why
// (see classify). Events of one ordering key go in batch order through one
// topic's publisher; when one fails, every later event of its key in the
// batch fails as sink.ErrHeldBack carrying the first failure's class, and
// the key stays paused in the client until the next Publish call with it
// (resumeKeys). Publish is safe for concurrent use.
func (s *Sink) Publish(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.closed, func() { cancel(errClosed) })
	defer func() {
		stop()
		cancel(nil)
	}()
	c := &call{refs: make([]keyRef, len(batch)), errs: make([]error, len(batch)),
		results: make([]*pubsub.PublishResult, len(batch)), sent: map[keyRef]int{}, pubs: map[string]*publisher{}}
	defer s.release(c)
	s.send(ctx, c, batch)
	for i, r := range c.results {
		if r != nil {
			if _, err := r.Get(ctx); err != nil {
				c.errs[i] = s.classify(ctx, err)
			}
		}
	}
	s.settle(c)
	failed := false
	for i, err := range c.errs {
		if err != nil {
			c.errs[i] = fmt.Errorf("publish %s to pubsub topic %s: %w", batch[i].ID, c.refs[i].topic, err)
			failed = true
		}
	}
	if failed {
		return &sink.BatchError{Errs: c.errs}
	}
	return nil
}

// send hands the events of batch to their topics' publishers. An event
// that cannot be sent (its topic or message is invalid) fails at once, and
// the later events of its key are held back. A key that must be isolated
// sends only its first event.
func (s *Sink) send(ctx context.Context, c *call, batch []*event.Event) {
	stopped := map[keyRef]error{}
	for i, e := range batch {
		ref, err := s.ref(e)
		c.refs[i] = ref
		if first := stopped[ref]; first != nil {
			c.errs[i] = heldBack(first)
			continue
		}
		var msg *pubsub.Message
		if err == nil {
			msg, err = s.message(e, ref.key)
		}
		if err == nil && c.sent[ref] > 0 && s.isolated(ref) {
			err = fmt.Errorf("%w: an earlier event of its ordering key is sent alone", sink.ErrHeldBack)
		}
		if err != nil {
			c.errs[i] = err
			if ref.key != "" {
				stopped[ref] = err
			}
			continue
		}
		p := c.pubs[ref.topic]
		if p == nil {
			if p = s.acquire(ref.topic); p == nil {
				c.errs[i] = fault.AsUnavailable(errClosed)
				continue
			}
			c.pubs[ref.topic] = p
		}
		if c.sent[ref] == 0 {
			s.resumeKey(p.Publisher, ref)
		}
		c.sent[ref]++
		c.results[i] = p.Publish(ctx, msg)
	}
}

// settle applies the order of each key to c's results: after the first
// failure of a key every later event of it fails as held back; a key with
// a failed send is noted for resumeKey; a rejection of a message sent with
// others of its key is retried alone (see isolated).
func (s *Sink) settle(c *call) {
	first := map[keyRef]error{}
	for i, ref := range c.refs {
		if ref.key == "" {
			continue
		}
		if f := first[ref]; f != nil {
			c.errs[i] = heldBack(f)
			continue
		}
		err := c.errs[i]
		if c.results[i] == nil {
			if err != nil {
				first[ref] = err
			}
			continue
		}
		s.mu.Lock()
		switch {
		case err == nil:
			delete(s.isolate, ref)
		case fault.ClassOf(err) == fault.Permanent && c.sent[ref] > 1:
			// The request may have carried another, bad message of the key.
			s.isolate[ref] = true
			err = fault.AsSuspect(fmt.Errorf("rejected in a request with other messages of its ordering key; it is sent alone next: %s", err))
			c.errs[i] = err
		case fault.ClassOf(err) == fault.Permanent:
			delete(s.isolate, ref)
		}
		if err != nil {
			s.paused[ref] = true
		}
		s.mu.Unlock()
		if err != nil {
			first[ref] = err
		}
	}
}

// resumeKey resumes ref's key in p when a failed send may have paused it.
// It is called only when a Publish call sends the first event of the key:
// the pipeline has then taken the failure and publishes again from the
// failed event (it never has two calls with one key in flight), so no
// message of the key queued behind the failed one can slip out before it.
func (s *Sink) resumeKey(p *pubsub.Publisher, ref keyRef) {
	s.mu.Lock()
	paused := s.paused[ref]
	delete(s.paused, ref)
	s.mu.Unlock()
	if paused {
		p.ResumePublish(ref.key)
	}
}

// isolated reports whether the next event of ref goes alone.
func (s *Sink) isolated(ref keyRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.isolate[ref]
}

// heldBack is the error of an event behind first, its key's first failure.
func heldBack(first error) error {
	return fmt.Errorf("%w (%w)", sink.ErrHeldBack, first)
}

// ref returns e's topic and ordering key. A rendered topic Pub/Sub does not
// accept fails as fault.Permanent: no such topic can exist.
func (s *Sink) ref(e *event.Event) (keyRef, error) {
	topic := s.tmpl.Render(e)
	ref := keyRef{topic: topic, key: orderingKey(e.Key())}
	if !s.tmpl.Fixed() {
		if err := destname.PubSubTopic(topic); err != nil {
			return ref, fault.AsPermanent(fmt.Errorf("template %q: %w", s.cfg.Topic, err))
		}
	}
	return ref, nil
}

// orderingKey returns k when Pub/Sub accepts it as an ordering key (valid
// UTF-8, at most maxOrderingKey bytes), else a deterministic valid key
// derived from it: its valid UTF-8 cut to leave room, "_" and the first
// 16 hex digits of k's SHA-256.
func orderingKey(k string) string {
	if len(k) <= maxOrderingKey && utf8.ValidString(k) {
		return k
	}
	v := strings.ToValidUTF8(k, "\uFFFD")
	n := min(len(v), maxOrderingKey-17)
	for n > 0 && n < len(v) && !utf8.RuneStart(v[n]) {
		n--
	}
	sum := sha256.Sum256([]byte(k))
	return v[:n] + "_" + hex.EncodeToString(sum[:8])
}

// message builds e's message with ordering key key. It fails as
// fault.Permanent when an attribute breaks Pub/Sub's limits (see attrs) or
// the message is over Options.MaxMessageBytes.
func (s *Sink) message(e *event.Event, key string) (*pubsub.Message, error) {
	attrs, err := s.attrs(e)
	if err != nil {
		return nil, fault.AsPermanent(err)
	}
	m := &pubsub.Message{Data: e.Payload, Attributes: attrs, OrderingKey: key}
	if n := proto.Size(&pb.PubsubMessage{Data: m.Data, Attributes: attrs, OrderingKey: key}); n > s.opts.MaxMessageBytes {
		return nil, fault.AsPermanent(fmt.Errorf("message of %d bytes (data, attributes, ordering key) is over the limit of %d bytes", n, s.opts.MaxMessageBytes))
	}
	return m, nil
}

// attrs returns e's attributes: the contract attributes and the row
// headers the filter forwards. Pub/Sub refuses a message with an attribute
// name over 256 bytes or a value over 1024, with more than 100 attributes,
// or with text that is not UTF-8; such an event fails, naming the
// attribute.
func (s *Sink) attrs(e *event.Event) (map[string]string, error) {
	a := make(map[string]string, 5+len(e.Headers))
	for k, v := range e.Headers {
		if s.rows.Forward(k) {
			a[k] = v
		}
	}
	a[attrMessageID], a[attrEventType], a[attrAggregateType], a[attrAggregateID] = e.ID, e.EventType, e.AggregateType, e.AggregateID
	if e.ContentType != "" {
		a[attrContentType] = e.ContentType
	}
	if len(a) > maxAttributes {
		return nil, fmt.Errorf("%d attributes (the row's headers and the relay's), over Pub/Sub's %d", len(a), maxAttributes)
	}
	for k, v := range a {
		switch {
		case k == "" || len(k) > maxAttrNameBytes || !utf8.ValidString(k):
			return nil, fmt.Errorf("attribute name %s: Pub/Sub takes 1 to %d bytes of UTF-8", rowtext.Label(k), maxAttrNameBytes)
		case len(v) > maxAttrValueBytes || !utf8.ValidString(v):
			return nil, fmt.Errorf("attribute %s: the value (%d bytes) is over Pub/Sub's %d bytes or not UTF-8", rowtext.Label(k), len(v), maxAttrValueBytes)
		}
	}
	return a, nil
}

// classify marks a publish error with its fault.Class; ctx is the Publish
// call's context, whose cause tells a closed sink from a cancelled call.
// InvalidArgument (a message Pub/Sub refuses: too large, bad attributes)
// is the event's fault, permanent and suspect; a paused key is held back;
// every other code (Unavailable, DeadlineExceeded, ResourceExhausted,
// Internal, Unauthenticated, PermissionDenied, NotFound for a missing
// topic, ...) is the destination's fault, unavailable.
func (s *Sink) classify(ctx context.Context, err error) error {
	var paused pubsub.ErrPublishingPaused
	switch {
	case errors.As(err, &paused):
		return fmt.Errorf("%w: %v", sink.ErrHeldBack, err)
	case errors.Is(err, pubsub.ErrOversizedMessage):
		return fault.AsPermanent(err)
	case errors.Is(err, pubsub.ErrPublisherStopped), errors.Is(context.Cause(ctx), errClosed):
		return fault.AsUnavailable(errClosed)
	case ctx.Err() != nil:
		return fault.AsUnavailable(err)
	}
	st, ok := status.FromError(err)
	switch {
	case ok && st.Code() == codes.InvalidArgument,
		ok && st.Code() == codes.Internal && strings.Contains(st.Message(), "invalid UTF-8"):
		return fault.AsSuspect(fault.AsPermanent(err))
	case ok && (st.Code() == codes.PermissionDenied || st.Code() == codes.Unauthenticated):
		return fault.AsUnavailable(fmt.Errorf("%w; %s", err, credentialsHint))
	}
	return fault.AsUnavailable(err)
}

// credentialsHint says how to fix refused credentials.
const credentialsHint = "grant the relay's service account roles/pubsub.publisher on the topic (and roles/pubsub.viewer for relay check), and check its credentials: Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, GKE workload identity) or sink.pubsub.credentials_file"

// MaxPerAggregate implements sink.Ordered: the client keeps the messages
// of one ordering key in order and fails every one behind a failed one.
func (s *Sink) MaxPerAggregate() int { return s.opts.MaxPerAggregate }

var _ sink.Ordered = (*Sink)(nil)

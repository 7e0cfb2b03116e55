// Package pubsub publishes events to Google Cloud Pub/Sub topics with the
// cloud.google.com/go/pubsub/v2 client, message ordering enabled.
//
// sink.pubsub.topic is a topic ID template; each rendered topic gets a
// publisher of its own, at most Options.MaxPublishers open at once (the
// least recently used idle one is stopped beyond it). The ordering key of every message is the event's
// ordering key (event.Event.Key: the aggregate id, or outbox.order_by). The
// client sends the messages of one ordering key one request after another
// and, when a request fails, pauses the key: every later message of the
// key fails until ResumePublish. The sink resumes a key only when the next
// Publish call with that key starts, which the pipeline makes only after it
// took the failure and republishes from the failed event on (see
// resumeKeys), so a pause neither reorders nor stalls an aggregate.
//
// Credentials come from Application Default Credentials (the
// GOOGLE_APPLICATION_CREDENTIALS file, the gcloud user, the metadata server
// of GCE, GKE workload identity, Cloud Run) unless sink.pubsub.
// credentials_file names a credentials JSON file; with PUBSUB_EMULATOR_HOST
// set the client talks plain gRPC to the emulator without credentials.
// Failures are classified by gRPC code: see classify.
package pubsub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"

	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/template"
)

// DefaultMaxMessageBytes is the default of Options.MaxMessageBytes: Pub/Sub's
// request limit of 10 MB less room for the request's topic name.
const DefaultMaxMessageBytes = 10_000_000 - 512

// Config says where a Sink publishes. The relay fills it from the
// sink.pubsub keys of its configuration file.
type Config struct {
	// ProjectID is the Google Cloud project of the topics. Required.
	ProjectID string
	// Topic is the topic ID template, such as "outbox.{aggregate_type}".
	// Required.
	Topic string
	// CredentialsFile, when set, is a credentials JSON file (a service
	// account key, an external account configuration for workload identity
	// federation, an authorized user) used instead of Application Default
	// Credentials. Ignored while PUBSUB_EMULATOR_HOST is set.
	CredentialsFile string
	// Endpoint overrides the Pub/Sub endpoint, such as a regional one
	// ("europe-west1-pubsub.googleapis.com:443"). Default empty: the global
	// endpoint. With PUBSUB_EMULATOR_HOST set, Endpoint overrides the
	// emulator's address; the client still dials plain gRPC without
	// credentials.
	Endpoint string
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// PublishTimeout bounds one publish request of the client, its own
	// retries of Unavailable included. Default 30s.
	PublishTimeout time.Duration
	// BatchDelay is how long the client waits for more messages of one
	// ordering key before it sends a request. Default 1ms: the pipeline
	// already hands over batches.
	BatchDelay time.Duration
	// BatchCount and BatchBytes end a request early: at most this many
	// messages or bytes of one ordering key. Default 100 and 1 MB.
	BatchCount int
	BatchBytes int
	// MaxOutstandingMessages and MaxOutstandingBytes bound what one
	// topic's publisher holds unacknowledged; beyond them Publish waits
	// (flow control). Default 10000 messages and 256 MiB.
	MaxOutstandingMessages int
	MaxOutstandingBytes    int
	// MaxMessageBytes is the largest message (data, attributes and
	// ordering key as encoded) the sink sends; a larger event fails as
	// fault.Permanent. Default DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxPerAggregate is the most events of one ordering key a Publish
	// call takes (sink.Ordered). Default 100.
	MaxPerAggregate int
	// MaxPublishers is the most topic publishers (each with its goroutines
	// and buffers) the sink keeps open. Beyond it the least recently used
	// publisher without publishes in flight is stopped; one is opened again
	// when its topic is next published to. While every open publisher has
	// publishes in flight the sink opens more and stops the extra ones as
	// they finish. Default 100.
	MaxPublishers int
	// ClientOptions are added to the client's options (an endpoint and
	// transport of an in-process fake, say).
	ClientOptions []option.ClientOption
	// Logger receives topic resolutions. Default slog.Default().
	Logger *slog.Logger
	// HeaderDrops counts and logs the row headers the sink does not
	// forward. Default: counters of the sink's own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 30 * time.Second
	}
	if o.BatchDelay <= 0 {
		o.BatchDelay = time.Millisecond
	}
	def(&o.BatchCount, 100)
	def(&o.BatchBytes, 1_000_000)
	def(&o.MaxOutstandingMessages, 10_000)
	def(&o.MaxOutstandingBytes, 256<<20)
	def(&o.MaxMessageBytes, DefaultMaxMessageBytes)
	def(&o.MaxPerAggregate, 100)
	def(&o.MaxPublishers, 100)
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

// Sink publishes events to Pub/Sub. It implements sink.Sink, sink.Ordered
// and sink.Destinations; its methods are safe for concurrent use.
type Sink struct {
	cfg    Config
	opts   Options
	client *pubsub.Client
	tmpl   template.Template
	rows   *sink.HeaderFilter

	mu         sync.Mutex
	publishers map[string]*publisher // open ones, by topic ID
	uses       uint64                // counts acquire calls, for publisher.used
	paused     map[keyRef]bool       // keys the client may hold paused
	isolate    map[keyRef]bool       // keys whose next event goes alone
	stopped    bool

	closed    context.Context // cancelled by Close
	closeNow  context.CancelCauseFunc
	closeOnce sync.Once
}

// keyRef is an ordering key of one topic's publisher.
type keyRef struct{ topic, key string }

// errClosed fails the publishes of a closed sink.
var errClosed = errors.New("pubsub sink closed")

// New returns a sink for cfg. It creates the client (no request is made:
// see Check) and fails on a topic template that cannot render valid topic
// IDs and on a credentials file it cannot read.
func New(ctx context.Context, cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	if cfg.ProjectID == "" {
		return nil, errors.New("sink.pubsub.project_id is required")
	}
	if err := destname.PubSubTopicTemplate(cfg.Topic); err != nil {
		return nil, fmt.Errorf("sink.pubsub.topic %q: %w", cfg.Topic, err)
	}
	tmpl, err := template.Parse(cfg.Topic, sanitize)
	if err != nil {
		return nil, fmt.Errorf("sink.pubsub.topic: %w", err)
	}
	copts, err := clientOptions(cfg)
	if err != nil {
		return nil, err
	}
	copts = append(copts, opts.ClientOptions...)
	client, err := pubsub.NewClientWithConfig(ctx, cfg.ProjectID, &pubsub.ClientConfig{
		TopicAdminCallOptions: &vkit.TopicAdminCallOptions{Publish: []gax.CallOption{gax.WithRetry(newRetryer)}},
	}, copts...)
	if err != nil {
		return nil, fmt.Errorf("sink.pubsub: %w", err)
	}
	s := &Sink{cfg: cfg, opts: opts, client: client, tmpl: tmpl.Limit(destname.MaxPubSubTopic),
		rows:       sink.NewHeaderFilter(Rules, "", opts.HeaderDrops),
		publishers: map[string]*publisher{}, paused: map[keyRef]bool{}, isolate: map[keyRef]bool{}}
	s.closed, s.closeNow = context.WithCancelCause(context.Background())
	return s, nil
}

// clientOptions returns the options of cfg's endpoint and credentials.
// With PUBSUB_EMULATOR_HOST set, the client library dials the emulator
// without credentials itself.
func clientOptions(cfg Config) ([]option.ClientOption, error) {
	o := []option.ClientOption{option.WithGRPCDialOption(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: reconnect, MinConnectTimeout: 20 * time.Second}))}
	if cfg.Endpoint != "" {
		o = append(o, option.WithEndpoint(cfg.Endpoint))
	}
	if cfg.CredentialsFile == "" || os.Getenv("PUBSUB_EMULATOR_HOST") != "" {
		return o, nil
	}
	typ, err := credentialsType(cfg.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("sink.pubsub.credentials_file: %w", err)
	}
	return append(o, option.WithAuthCredentialsFile(typ, cfg.CredentialsFile)), nil
}

// reconnect is the client's backoff between attempts to connect to
// Pub/Sub: gRPC's default with at most 5s between attempts instead of 2
// minutes, so that the relay publishes again within seconds of the end of
// a long outage.
var reconnect = backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// credentialsType reads the "type" of a credentials JSON file. Only the
// type is read; nothing of the file is logged or returned.
func credentialsType(path string) (option.CredentialsType, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var f struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(b, &f) != nil {
		return "", fmt.Errorf("%s is not a JSON credentials file", path)
	}
	for _, t := range []option.CredentialsType{option.ServiceAccount, option.AuthorizedUser,
		option.ExternalAccount, option.ImpersonatedServiceAccount} {
		if string(t) == f.Type {
			return t, nil
		}
	}
	return "", fmt.Errorf("%s: credentials type %q is not one of service_account, authorized_user, external_account, impersonated_service_account", path, f.Type)
}

// newRetryer returns the client's retry policy for one publish request:
// Unavailable only (a dropped connection, a server restarting), at most
// three more tries within a second or two; the pipeline retries anything
// else, and holds the topic while Pub/Sub is down.
func newRetryer() gax.Retryer {
	return &limitedRetryer{Retryer: gax.OnCodes([]codes.Code{codes.Unavailable},
		gax.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}), left: 3}
}

// limitedRetryer stops retrying after left retries.
type limitedRetryer struct {
	gax.Retryer
	left int
}

// Retry implements gax.Retryer.
func (r *limitedRetryer) Retry(err error) (time.Duration, bool) {
	if r.left <= 0 {
		return 0, false
	}
	r.left--
	return r.Retryer.Retry(err)
}

// sanitize maps a rune of a template value that Pub/Sub does not allow in
// a topic ID to '_'.
func sanitize(r rune) rune {
	if destname.PubSubTopicRune(r) {
		return r
	}
	return '_'
}

// Rules are the attribute names Pub/Sub reserves: those starting with
// "goog", in any case. A row header so named is not forwarded.
var Rules = sink.HeaderRules{Prefixes: []string{"goog"}}

// Destination describes where the sink publishes, for logs and relay check.
func (s *Sink) Destination() string {
	return fmt.Sprintf("pubsub project %s topic %s", s.cfg.ProjectID, s.cfg.Topic)
}

// publisher is an open topic publisher.
type publisher struct {
	*pubsub.Publisher
	topic    string
	inflight int                     // Publish calls using it
	used     uint64                  // Sink.uses at its last acquire
	pending  []*pubsub.PublishResult // of calls that returned before their results were in
}

// acquire returns the publisher of topic for one Publish call, opening it
// with message ordering enabled on first use, or nil once the sink is
// closed. The call must release it when its results are in.
func (s *Sink) acquire(topic string) *publisher {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.uses++
	p := s.publishers[topic]
	if p == nil {
		p = &publisher{Publisher: s.client.Publisher(topic), topic: topic}
		p.EnableMessageOrdering = true
		p.PublishSettings.DelayThreshold = s.opts.BatchDelay
		p.PublishSettings.CountThreshold = s.opts.BatchCount
		p.PublishSettings.ByteThreshold = s.opts.BatchBytes
		p.PublishSettings.Timeout = s.opts.PublishTimeout
		p.PublishSettings.FlowControlSettings = pubsub.FlowControlSettings{
			MaxOutstandingMessages: s.opts.MaxOutstandingMessages,
			MaxOutstandingBytes:    s.opts.MaxOutstandingBytes,
			LimitExceededBehavior:  pubsub.FlowControlBlock,
		}
		s.publishers[topic] = p
	}
	p.inflight++
	p.used = s.uses
	return p
}

// release ends c's use of its publishers, keeping the results not yet in
// (of a call its context ended) as in flight, and stops the least recently
// used idle publishers while more than Options.MaxPublishers are open.
func (s *Sink) release(c *call) {
	s.mu.Lock()
	for _, p := range c.pubs {
		p.inflight--
		p.pending = slices.DeleteFunc(p.pending, done)
	}
	for i, r := range c.results {
		if r != nil && !done(r) {
			p := c.pubs[c.refs[i].topic]
			p.pending = append(p.pending, r)
		}
	}
	var idle []*publisher
	for len(s.publishers) > s.opts.MaxPublishers && !s.stopped {
		p := s.leastUsedIdle()
		if p == nil {
			break
		}
		delete(s.publishers, p.topic)
		// The key state a stopped publisher held is gone: a new publisher
		// of the topic starts with no key paused. Nothing of the topic is
		// in flight, so no message can overtake a failed one; the next
		// call with a failed key republishes from the failed event.
		for ref := range s.paused {
			if ref.topic == p.topic {
				delete(s.paused, ref)
			}
		}
		idle = append(idle, p)
	}
	s.mu.Unlock()
	for _, p := range idle {
		p.Stop() // nothing is in flight: there is nothing to flush
	}
}

// leastUsedIdle returns the least recently acquired open publisher with no
// Publish call using it and no message in flight, or nil. s.mu must be
// held.
func (s *Sink) leastUsedIdle() *publisher {
	var lru *publisher
	for _, p := range s.publishers {
		p.pending = slices.DeleteFunc(p.pending, done)
		if p.inflight == 0 && len(p.pending) == 0 && (lru == nil || p.used < lru.used) {
			lru = p
		}
	}
	return lru
}

// done reports whether r's result is in.
func done(r *pubsub.PublishResult) bool {
	select {
	case <-r.Ready():
		return true
	default:
		return false
	}
}

// Close fails in-flight and later Publish calls with an error classified
// fault.Unavailable, closes the client's connections (so what is still in
// flight fails at once) and stops the publishers. It is idempotent.
func (s *Sink) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closeNow(errClosed)
		s.mu.Lock()
		s.stopped = true
		pubs := s.publishers
		s.mu.Unlock()
		err = s.client.Close()
		for _, p := range pubs {
			p.Stop()
		}
	})
	return err
}

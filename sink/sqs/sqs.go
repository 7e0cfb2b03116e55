// Package sqs publishes events to Amazon SQS queues, and to SQS-compatible
// servers through sink.sqs.endpoint, with SendMessageBatch.
//
// sink.sqs.queue_url names one queue; sink.sqs.queue is instead a queue name
// template, each rendered name resolved with GetQueueUrl and cached. The
// sink never creates queues. On a FIFO queue (a name ending in ".fifo")
// MessageGroupId is the ordering key (Event.Key) and MessageDeduplicationId the
// message_id. The message format (body encoding, attributes) is in
// docs/reference.md; batching and the mapping of odd values in
// docs/design.md. Failures are classified by scope: see classify and
// entryError.
package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/outboxrelay/relay/internal/destname"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/envelope"
	"github.com/outboxrelay/relay/sink/template"
)

// Limits of SQS.
const (
	// maxEntries is the most entries of one SendMessageBatch request.
	maxEntries = 10
	// maxMessageBytes is the largest message SQS takes, body and
	// attributes; a queue's MaximumMessageSize may be lower.
	maxMessageBytes = 1 << 20
	// defaultMaxBatchBytes is the default of sink.sqs.max_batch_bytes: the
	// request size limit of SQS before 2025 and of many compatible servers.
	defaultMaxBatchBytes = 256 << 10
	fifoSuffix           = ".fifo"
)

// Config says where a Sink publishes. The relay fills it from the sink.sqs
// keys of its configuration file.
type Config struct {
	// Region is the AWS region. Required.
	Region string
	// Endpoint overrides the SQS endpoint (emulators, VPC endpoints).
	// Default empty: the region's endpoint.
	Endpoint string
	// QueueURL is one fixed queue. Exactly one of QueueURL and Queue is set.
	QueueURL string
	// Queue is a queue name template resolved with GetQueueUrl.
	Queue string
	// MaxBatchBytes caps the size of one SendMessageBatch request: message
	// bodies plus attribute names, types and values. Zero means 262144,
	// which every SQS-compatible server accepts.
	MaxBatchBytes int
	// RoleARN, when set, is a role assumed with STS AssumeRole by the
	// default chain's credentials (or Options.Credentials); its temporary
	// credentials sign the SQS requests and are renewed before they
	// expire. STS is reached at its regional endpoint, or where
	// AWS_ENDPOINT_URL_STS points. Default empty: no role is assumed.
	RoleARN string
	// ExternalID is sent with AssumeRole when set.
	ExternalID string
	// RoleSessionName names the role session; default "outbox-relay".
	RoleSessionName string
}

// Options tunes a Sink. The zero value uses the defaults documented on each
// field.
type Options struct {
	// Concurrency caps the SendMessageBatch requests one Publish call has
	// in flight at once. Default 8.
	Concurrency int
	// RequestTimeout bounds one request, the SDK's own retries of it
	// included. Default 30s.
	RequestTimeout time.Duration
	// MaxAttempts is how often the SDK tries one request before the error
	// goes back to the pipeline, which retries in turn. Default 3.
	MaxAttempts int
	// Credentials replaces the default credential chain (environment,
	// shared config and credentials files, web identity, container and
	// instance roles) when set.
	Credentials aws.CredentialsProvider
	// Logger receives queue resolutions. Default slog.Default().
	Logger *slog.Logger
	// Envelope, when set, sends every event as a CloudEvent in structured
	// content mode: the body is the JSON event format. Default nil: no
	// envelope.
	Envelope *envelope.CloudEvents
	// HeaderDrops counts and logs the row headers the sink does not
	// forward (see sink.HeaderFilter). Default: counters of the sink's
	// own, logging to Logger.
	HeaderDrops *sink.HeaderDrops
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	o.Logger, o.HeaderDrops = sink.LogDefaults(o.Logger, o.HeaderDrops)
	return o
}

// Sink publishes events to SQS. It implements sink.Sink; its methods are
// safe for concurrent use.
type Sink struct {
	cfg      Config
	opts     Options
	client   *sqs.Client
	creds    aws.CredentialsProvider
	http     *http.Client
	maxBatch int

	// fixed is the queue of sink.sqs.queue_url; url is empty for a
	// template.
	fixed queueRef
	// tmpl renders queue names when sink.sqs.queue is set.
	tmpl template.Template
	// fifo says whether the template renders FIFO queue names.
	fifo bool
	rows *sink.HeaderFilter

	mu   sync.Mutex
	urls map[string]*resolution // queue name -> URL, for the template

	closed    context.Context // cancelled by Close
	closeNow  context.CancelCauseFunc
	closeOnce sync.Once
}

// queueRef is a resolved queue.
type queueRef struct {
	name string
	url  string
	fifo bool
}

// New returns a sink for cfg. It loads the AWS configuration (region from
// cfg.Region, credentials from the default chain unless opts.Credentials is
// set, the endpoint from cfg.Endpoint when set) but makes no request: see
// Check. It fails on a queue_url that is not a URL and on a queue template
// that cannot render valid queue names.
func New(ctx context.Context, cfg Config, opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	s := &Sink{cfg: cfg, opts: opts, maxBatch: cfg.MaxBatchBytes, urls: map[string]*resolution{},
		rows: sink.NewHeaderFilter(sink.SQSRules, "", opts.HeaderDrops)}
	if s.maxBatch <= 0 {
		s.maxBatch = defaultMaxBatchBytes
	}
	switch {
	case cfg.QueueURL != "" && cfg.Queue != "":
		return nil, errors.New("sink.sqs: set either queue_url or queue, not both")
	case cfg.QueueURL != "":
		ref, err := parseQueueURL(cfg.QueueURL)
		if err != nil {
			return nil, fmt.Errorf("sink.sqs.queue_url: %w", err)
		}
		s.fixed = ref
	case cfg.Queue != "":
		fifo, err := checkQueueTemplate(cfg.Queue)
		if err != nil {
			return nil, fmt.Errorf("sink.sqs.queue: %w", err)
		}
		if s.tmpl, err = template.Parse(cfg.Queue, sanitize); err != nil {
			return nil, fmt.Errorf("sink.sqs.queue: %w", err)
		}
		s.tmpl = s.tmpl.Limit(destname.MaxSQSQueue)
		s.fifo = fifo
	default:
		return nil, errors.New("sink.sqs: queue_url or queue is required")
	}

	loadOpts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(cfg.Region),
		awsconfig.WithHTTPClient(newHTTPClient()),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = opts.MaxAttempts
				o.MaxBackoff = time.Second
				// The pipeline backs off itself; a client-side retry quota
				// would only turn a long outage into quota errors.
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if opts.Credentials != nil {
		loadOpts = append(loadOpts, awsconfig.WithCredentialsProvider(opts.Credentials))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("sink.sqs: load AWS configuration: %w", err)
	}
	// LoadDefaultConfig applies AWS_CA_BUNDLE and the like to the client's
	// transport; the sink then owns a client on that transport, so that
	// Close can close its idle connections.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		tr = bc.GetTransport()
	}
	s.http = &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	awsCfg.HTTPClient = s.http
	if cfg.RoleARN != "" {
		awsCfg.Credentials = assumeRole(awsCfg, cfg)
	}
	if awsCfg.Credentials != nil {
		awsCfg.Credentials = markedCredentials{awsCfg.Credentials}
	}
	s.creds = awsCfg.Credentials
	s.client = sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	s.closed, s.closeNow = context.WithCancelCause(context.Background())
	return s, nil
}

// assumeRole returns the credentials of cfg.RoleARN, assumed with STS by
// awsCfg's credentials over its HTTP client, cached until shortly before
// they expire.
func assumeRole(awsCfg aws.Config, cfg Config) aws.CredentialsProvider {
	session := cfg.RoleSessionName
	if session == "" {
		session = "outbox-relay"
	}
	return aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(sts.NewFromConfig(awsCfg), cfg.RoleARN, func(o *stscreds.AssumeRoleOptions) {
		o.RoleSessionName = session
		if cfg.ExternalID != "" {
			o.ExternalID = aws.String(cfg.ExternalID)
		}
	}))
}

// newHTTPClient returns the HTTP client configuration of a sink:
// keep-alive connections enough for several concurrent Publish calls, and
// a short dial timeout so that an unreachable endpoint fails fast.
func newHTTPClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) { d.Timeout = 5 * time.Second }).
		WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConns = 256
			tr.MaxIdleConnsPerHost = 64
			tr.IdleConnTimeout = 90 * time.Second
		})
}

// parseQueueURL returns the queue of a queue URL: its name is the last
// path segment.
func parseQueueURL(raw string) (queueRef, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return queueRef{}, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return queueRef{}, fmt.Errorf("%q is not an http(s) queue URL such as https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo", raw)
	}
	name := u.Path[strings.LastIndexByte(u.Path, '/')+1:]
	if name == "" {
		return queueRef{}, fmt.Errorf("%q has no queue name as its last path segment", raw)
	}
	return queueRef{name: name, url: raw, fifo: strings.HasSuffix(name, fifoSuffix)}, nil
}

// sanitize maps a rune of a template value that SQS does not allow in a
// queue name to '_'.
func sanitize(r rune) rune {
	if destname.SQSQueueRune(r) {
		return r
	}
	return '_'
}

// checkQueueTemplate checks that tmpl renders valid queue names: its
// literal text holds only characters allowed in a queue name, except for a
// trailing ".fifo", which makes every rendered queue a FIFO queue.
func checkQueueTemplate(tmpl string) (fifo bool, err error) {
	base := strings.TrimSuffix(tmpl, fifoSuffix)
	fifo = base != tmpl
	literal := base
	for _, p := range template.Placeholders {
		literal = strings.ReplaceAll(literal, p, "")
	}
	if base == "" {
		return false, fmt.Errorf("template %q: empty queue name", tmpl)
	}
	if strings.Map(sanitize, literal) != literal {
		return false, fmt.Errorf("template %q: an SQS queue name holds only letters, digits, '-' and '_', and ends in .fifo for a FIFO queue", tmpl)
	}
	if literal == base && len(tmpl) > destname.MaxSQSQueue {
		return false, fmt.Errorf("template %q: a queue name has at most %d characters", tmpl, destname.MaxSQSQueue)
	}
	return fifo, nil
}

// Destination describes where the sink publishes, for logs and relay check:
// the queue URL, or the name template.
func (s *Sink) Destination() string {
	if s.fixed.url != "" {
		kind := "standard"
		if s.fixed.fifo {
			kind = "FIFO"
		}
		return fmt.Sprintf("sqs %s queue %s", kind, s.fixed.url)
	}
	kind := "standard"
	if s.fifo {
		kind = "FIFO"
	}
	return fmt.Sprintf("sqs %s queues named by template %s", kind, s.cfg.Queue)
}

// errClosed fails the publishes of a closed sink.
var errClosed = errors.New("sqs sink closed")

// Close fails in-flight and later Publish calls with an error classified
// fault.Unavailable and closes idle connections. It is idempotent and
// always returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.closeNow(errClosed)
		s.http.CloseIdleConnections()
	})
	return nil
}

// markedCredentials marks the errors of a credentials provider so that
// classify recognises them: without credentials no request can be made,
// whatever the event.
type markedCredentials struct{ aws.CredentialsProvider }

// credentialsError is a failure to obtain credentials.
type credentialsError struct{ err error }

func (e *credentialsError) Error() string { return "AWS credentials: " + e.err.Error() }
func (e *credentialsError) Unwrap() error { return e.err }

// Retrieve returns the provider's credentials, marking its errors.
func (m markedCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c, err := m.CredentialsProvider.Retrieve(ctx)
	if err != nil {
		return c, &credentialsError{err}
	}
	return c, nil
}

package sqs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// item is one event of a Publish call on its way to SQS.
type item struct {
	i   int // index in the batch
	msg message
	err error
}

// Publish sends every event of batch and returns nil when SQS accepted all
// of them (HTTP 200 and a successful entry each), or a *sink.BatchError
// saying which failed and why, classified as the package documentation
// describes. Events are grouped by queue and sent in SendMessageBatch
// requests of at most 10 entries and sink.sqs.max_batch_bytes, up to
// Options.Concurrency requests at once. Publish is safe for concurrent use;
// see the package documentation for why FIFO order holds.
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

	errs := make([]error, len(batch))
	names := make([]string, len(batch))
	var order []string // queue names in order of first appearance
	byQueue := map[string][]*item{}
	for i, e := range batch {
		name, err := s.queueName(e)
		if err != nil {
			errs[i] = err
			continue
		}
		names[i] = name
		if byQueue[name] == nil {
			order = append(order, name)
		}
		byQueue[name] = append(byQueue[name], &item{i: i})
	}

	var chunks []chunk
	for _, name := range order {
		items := byQueue[name]
		q, err := s.resolve(ctx, name)
		if err != nil {
			for _, it := range items {
				errs[it.i] = err
			}
			continue
		}
		var sendable []*item
		for _, it := range items {
			e := batch[it.i]
			if env := s.opts.Envelope; env != nil {
				if errs[it.i] = env.Check(e); errs[it.i] != nil {
					continue
				}
				e = structured(e, env)
			}
			it.msg = newMessage(e, q.fifo, s.rows)
			if it.msg.size > maxMessageBytes {
				errs[it.i] = fault.AsPermanent(fmt.Errorf("message of %d bytes (body and attributes) is over the SQS limit of %d bytes", it.msg.size, maxMessageBytes))
				continue
			}
			sendable = append(sendable, it)
		}
		chunks = append(chunks, split(q, sendable, s.maxBatch)...)
	}

	sem := make(chan struct{}, s.opts.Concurrency)
	var wg sync.WaitGroup
	for _, c := range chunks {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.send(ctx, c.q, c.items, true)
		})
	}
	wg.Wait()
	for _, c := range chunks {
		for _, it := range c.items {
			errs[it.i] = it.err
		}
	}

	failed := false
	for i, err := range errs {
		if err != nil {
			dest := names[i]
			if dest == "" {
				dest = "(none)"
			}
			errs[i] = fmt.Errorf("publish %s to sqs queue %s: %w", batch[i].ID, dest, err)
			failed = true
		}
	}
	if failed {
		return &sink.BatchError{Errs: errs}
	}
	return nil
}

// chunk is the entries of one SendMessageBatch request.
type chunk struct {
	q     queueRef
	items []*item
}

// split cuts items into chunks of at most maxEntries entries and maxBytes
// bytes, keeping their order; an item larger than maxBytes gets a chunk of
// its own.
func split(q queueRef, items []*item, maxBytes int) []chunk {
	var out []chunk
	var cur []*item
	size := 0
	for _, it := range items {
		if len(cur) > 0 && (len(cur) == maxEntries || size+it.msg.size > maxBytes) {
			out = append(out, chunk{q, cur})
			cur, size = nil, 0
		}
		cur = append(cur, it)
		size += it.msg.size
	}
	if len(cur) > 0 {
		out = append(out, chunk{q, cur})
	}
	return out
}

// send sends items in one SendMessageBatch request and sets each item's
// err. When SQS rejects a request of several entries as malformed and
// mayRetryAlone is set, it sends each entry again in a request of its own.
func (s *Sink) send(ctx context.Context, q queueRef, items []*item, mayRetryAlone bool) {
	entries := make([]types.SendMessageBatchRequestEntry, len(items))
	for k, it := range items {
		entries[k] = it.msg.entry(strconv.Itoa(k))
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	out, err := s.client.SendMessageBatch(rctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(q.url), Entries: entries})
	cancel()
	if err != nil {
		code := apiCode(err)
		if mayRetryAlone && len(items) > 1 && malformed[code] {
			for _, it := range items {
				s.send(ctx, q, []*item{it}, false)
			}
			return
		}
		if noQueue[code] {
			s.forget(q.name)
		}
		err = s.classify(ctx, err)
		for _, it := range items {
			it.err = err
		}
		return
	}
	done := make([]bool, len(items))
	for _, ok := range out.Successful {
		if k, err := strconv.Atoi(aws.ToString(ok.Id)); err == nil && k >= 0 && k < len(items) {
			done[k] = true
		}
	}
	for _, f := range out.Failed {
		if k, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && k >= 0 && k < len(items) && !done[k] {
			items[k].err = entryError(f)
			done[k] = true
		}
	}
	for k, it := range items {
		if !done[k] {
			it.err = errors.New("SendMessageBatch returned no result for this entry")
		}
	}
}

// Error codes by how they are handled. SQS answers with both the JSON
// protocol's codes and the legacy query codes, so both are listed.
var (
	// malformed codes reject a request for its content: with several
	// entries, each is sent alone to find the bad one; alone, it is
	// permanent.
	malformed = codes("InvalidParameterValue", "InvalidParameterValueException",
		"InvalidMessageContents", "BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong",
		"InvalidAttributeName", "InvalidAttributeValue", "MissingParameter", "InvalidParameterCombination",
		"InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId",
		"BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
		"TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest")
	// noQueue codes say the queue does not exist (yet).
	noQueue = codes("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
	// unavailable codes are failures of the queue or of SQS, whatever the
	// event: throttling, credentials SQS does not accept, a policy or KMS
	// key that does not let this client send, a missing queue, a server
	// error.
	unavailable = codes("RequestThrottled", "ThrottlingException", "Throttling", "ThrottledException",
		"TooManyRequestsException", "RequestLimitExceeded", "KmsThrottled", "SlowDown",
		"ServiceUnavailable", "InvalidClientTokenId", "UnrecognizedClientException",
		"SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException", "MissingAuthenticationToken",
		"IncompleteSignature", "InvalidSecurity", "RequestExpired", "AuthFailure",
		"AccessDenied", "AccessDeniedException", "KmsAccessDenied", "KmsDisabled",
		"KmsNotFound", "KmsInvalidState", "KmsInvalidKeyUsage", "KmsOptInRequired", "InternalError", "InternalFailure",
		"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
)

func codes(cs ...string) map[string]bool {
	m := make(map[string]bool, len(cs))
	for _, c := range cs {
		m[c] = true
	}
	return m
}

// apiCode returns the error code of an SQS API error in err's chain, or "".
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// entryFailure is an entry SQS rejected in a successful batch request.
type entryFailure struct {
	code, msg   string
	senderFault bool
}

func (e *entryFailure) Error() string {
	fault := "server fault"
	if e.senderFault {
		fault = "sender fault"
	}
	return fmt.Sprintf("sqs rejected the message: %s: %s (%s)", e.code, e.msg, fault)
}

// entryError classifies a failed entry: a code of the queue or of SQS is
// unavailable, a sender fault permanent and any other fault transient,
// both suspect (fault.AsSuspect).
func entryError(f types.BatchResultErrorEntry) error {
	err := &entryFailure{code: aws.ToString(f.Code), msg: aws.ToString(f.Message), senderFault: f.SenderFault}
	switch {
	case unavailable[err.code]:
		return fault.AsUnavailable(err)
	case malformed[err.code], err.senderFault:
		return fault.AsSuspect(fault.AsPermanent(err))
	}
	return fault.AsSuspect(err)
}

// classify marks a request error with its fault.Class; ctx is the Publish
// call's context, whose cause tells a closed sink from a cancelled call.
func (s *Sink) classify(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errClosed) {
			return fault.AsUnavailable(errClosed)
		}
		return fault.AsUnavailable(err)
	}
	code := apiCode(err)
	var status int
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var credErr *credentialsError
	switch {
	case errors.As(err, &credErr):
		return fault.AsUnavailable(fmt.Errorf("%w; %s", err, s.credentialsHint()))
	case unavailable[code], status >= 500, status == 401, status == 403:
		return fault.AsUnavailable(err)
	case malformed[code]:
		return fault.AsSuspect(fault.AsPermanent(err))
	case code == "" && isNetwork(err):
		return fault.AsUnavailable(err)
	}
	return fault.AsSuspect(err)
}

// isNetwork reports whether err is a failure to reach SQS or to get its
// answer: a send error, a timeout or a network error.
func isNetwork(err error) bool {
	var send *smithyhttp.RequestSendError
	var nerr net.Error
	var canceled *aws.RequestCanceledError
	return errors.As(err, &send) || errors.As(err, &nerr) || errors.As(err, &canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

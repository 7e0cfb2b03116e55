package sqs

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
)

const testRegion = "us-east-1"

// testCreds are static credentials, so that no test ever consults the
// default chain (and with it the instance metadata endpoint).
var testCreds = credentials.NewStaticCredentialsProvider("test", "test", "")

func startEmulator(t *testing.T) *testenv.SQS {
	t.Helper()
	srv, err := testenv.StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// newTestSink returns a sink on endpoint with static credentials; cfg's
// Region and Endpoint are filled in when empty.
func newTestSink(t *testing.T, endpoint string, cfg Config, opts Options) *Sink {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = testRegion
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = endpoint
	}
	if opts.Credentials == nil {
		opts.Credentials = testCreds
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newClient returns a plain SQS client for endpoint, to prepare and read
// queues.
func newClient(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       testRegion,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  testCreds,
	})
}

// createQueue creates queue name (FIFO when it ends in .fifo) with extra
// attributes and returns its URL.
func createQueue(t testing.TB, c *sqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	a := map[string]string{}
	for k, v := range attrs {
		a[k] = v
	}
	if strings.HasSuffix(name, ".fifo") {
		a["FifoQueue"] = "true"
	}
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// receiveAll receives and deletes every message the queue at url holds,
// in the order the queue hands them out, each SQS message once. Each
// ReceiveMessage of the emulator takes about 10ms, so several receivers
// work at once on a standard queue; a FIFO queue gets one, as the emulator
// (unlike SQS) may hand a group's next message to a concurrent receive
// before the previous one is deleted. A receiver stops after two empty
// answers only once the emulator counts no message left, in flight or
// delayed: a receive whose answer a loaded machine loses leaves its
// messages in flight until receiveVisibility has passed, and they are
// received then.
func receiveAll(t testing.TB, c *sqs.Client, url string) []types.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*receiveVisibility)
	defer cancel()
	var (
		mu   sync.Mutex
		out  []types.Message
		seen = map[string]bool{}
		fail error
		wg   sync.WaitGroup
	)
	receivers := 8
	if strings.HasSuffix(url, ".fifo") {
		receivers = 1
	}
	for range receivers {
		wg.Go(func() {
			empty := 0
			for {
				res, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
					QueueUrl:                    aws.String(url),
					MaxNumberOfMessages:         10,
					MessageAttributeNames:       []string{"All"},
					AttributeNames:              []types.QueueAttributeName{"All"}, //nolint:staticcheck // the emulator reads only the old field
					MessageSystemAttributeNames: []types.MessageSystemAttributeName{"All"},
					VisibilityTimeout:           int32(receiveVisibility / time.Second),
				})
				if err != nil {
					mu.Lock()
					fail = fmt.Errorf("receive from %s: %w", url, err)
					mu.Unlock()
					return
				}
				if len(res.Messages) == 0 {
					if empty++; empty < 2 { // the emulator can answer empty once under load
						continue
					}
					left, err := queueHolds(ctx, c, url)
					if err != nil || left == 0 {
						mu.Lock()
						fail = cmp.Or(fail, err)
						mu.Unlock()
						return
					}
					empty = 0
					time.Sleep(100 * time.Millisecond)
					continue
				}
				empty = 0
				mu.Lock()
				for _, m := range res.Messages {
					if id := aws.ToString(m.MessageId); !seen[id] {
						seen[id] = true
						out = append(out, m)
					}
				}
				mu.Unlock()
				entries := make([]types.DeleteMessageBatchRequestEntry, len(res.Messages))
				for i, m := range res.Messages {
					entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle}
				}
				if _, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}); err != nil {
					mu.Lock()
					fail = fmt.Errorf("delete from %s: %w", url, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if fail != nil {
		t.Fatal(fail)
	}
	return out
}

// receiveVisibility is how long a message receiveAll received stays
// invisible to other receives.
const receiveVisibility = 20 * time.Second

// queueHolds returns how many messages the emulator holds in the queue at
// url: visible, in flight or delayed.
func queueHolds(ctx context.Context, c *sqs.Client, url string) (int, error) {
	names := []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages,
		types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
	}
	res, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: names})
	if err != nil {
		return 0, fmt.Errorf("attributes of %s: %w", url, err)
	}
	n := 0
	for _, name := range names {
		v, err := strconv.Atoi(res.Attributes[string(name)])
		if err != nil {
			return 0, fmt.Errorf("attribute %s of %s: %w", name, url, err)
		}
		n += v
	}
	return n, nil
}

// attr returns the message attribute name of m (a String one, or the
// bytes of a Binary one), or "".
func attr(m types.Message, name string) string {
	return attrValue(m.MessageAttributes[name])
}

func attrValue(v types.MessageAttributeValue) string {
	if aws.ToString(v.DataType) == binaryType {
		return string(v.BinaryValue)
	}
	return aws.ToString(v.StringValue)
}

// decodedBody returns the payload carried by m, decoded as its
// body_encoding attribute says.
func decodedBody(t testing.TB, m types.Message) []byte {
	t.Helper()
	body := aws.ToString(m.Body)
	switch enc := attr(m, attrBodyEncoding); enc {
	case "":
		return []byte(body)
	case encodingBase64:
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			t.Errorf("message %s: body_encoding base64 but the body does not decode: %v", aws.ToString(m.MessageId), err)
		}
		return b
	case encodingEmpty:
		if body != emptyBody {
			t.Errorf("message %s: body_encoding empty with body %q", aws.ToString(m.MessageId), body)
		}
		return []byte{}
	default:
		t.Errorf("message %s: unknown body_encoding %q", aws.ToString(m.MessageId), enc)
		return nil
	}
}

// rowHeaders returns the row headers m carries: its attributes other than
// the contract ones, or the JSON object of its "headers" attribute.
func rowHeaders(t testing.TB, m types.Message) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range m.MessageAttributes {
		if k == attrHeaders {
			if err := json.Unmarshal([]byte(aws.ToString(v.StringValue)), &out); err != nil {
				t.Errorf("headers attribute %q: %v", aws.ToString(v.StringValue), err)
			}
			continue
		}
		if !slices.Contains([]string{attrMessageID, attrEventType, attrAggregateType, attrAggregateID, attrContentType, attrBodyEncoding}, k) {
			out[k] = attrValue(v)
		}
	}
	return out
}

func testEvent(n int, aggregateType, aggregateID string) *event.Event {
	return &event.Event{
		ID:            fmt.Sprintf("00000000-0000-4000-8000-%012d", n),
		AggregateType: aggregateType,
		AggregateID:   aggregateID,
		EventType:     "created",
		Payload:       fmt.Appendf(nil, `{"n": %d}`, n),
		ContentType:   event.ContentTypeJSON,
	}
}

// recorder is a reverse proxy in front of the emulator that records the
// action, body and signer of every request.
type recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	req []recorded
}

type recorded struct {
	action string
	body   []byte
	signer string // the access key id and session token that signed it
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		action := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "AmazonSQS.")
		r.mu.Lock()
		r.req = append(r.req, recorded{action, body, accessKey(req.Header.Get("Authorization")) + " " + req.Header.Get("X-Amz-Security-Token")})
		r.mu.Unlock()
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// requests returns the recorded requests of action, and forgets all.
func (r *recorder) take(action string) []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recorded
	for _, q := range r.req {
		if q.action == action {
			out = append(out, q)
		}
	}
	r.req = nil
	return out
}

// batchRequest is the part of a SendMessageBatch request the tests read.
type batchRequest struct {
	QueueUrl string
	Entries  []struct {
		Id                string
		MessageBody       string
		MessageGroupId    string
		MessageAttributes map[string]struct{ DataType, StringValue string }
	}
}

func decodeBatch(t *testing.T, body []byte) batchRequest {
	t.Helper()
	var b batchRequest
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("decode SendMessageBatch request: %v", err)
	}
	return b
}

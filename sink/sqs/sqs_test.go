package sqs

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
	"github.com/outboxrelay/relay/sink/template"
)

func TestPublishFIFOMessage(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "orders.fifo", nil)
	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	batch := []*event.Event{
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1,  "b":["ü", true]}`), ContentType: event.ContentTypeJSON,
			Headers: map[string]string{"trace_id": "t-1", "message_id": "spoofed"},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f61", AggregateType: "blob", AggregateID: "aggregate id with spaces",
			EventType: "blob.stored", Payload: binary, ContentType: event.ContentTypeBinary,
			Headers: map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5", "h6": "six"},
		},
		{
			ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f62", AggregateType: "note", AggregateID: "n-1",
			EventType: "note.cleared", Payload: []byte{}, ContentType: event.ContentTypeText,
		},
	}
	// Published twice, like a redelivery after a crash: SQS accepts the
	// second copies and drops them, as they come within the deduplication
	// interval. (The emulator forgets a deduplication ID once its message
	// is deleted, unlike SQS, so both publishes come before the receive.)
	for range 2 {
		if err := s.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	msgs := receiveAll(t, c, url)
	if len(msgs) != len(batch) {
		t.Fatalf("received %d messages, want %d (one per event)", len(msgs), len(batch))
	}
	byID := map[string]int{}
	for i, e := range batch {
		byID[e.ID] = i
	}
	for _, m := range msgs {
		i, ok := byID[attr(m, "message_id")]
		if !ok {
			t.Fatalf("message with message_id %q", attr(m, "message_id"))
		}
		e := batch[i]
		if got := decodedBody(t, m); !bytes.Equal(got, e.Payload) {
			t.Errorf("event %d: payload %q, want %q", i, got, e.Payload)
		}
		for name, want := range map[string]string{"event_type": e.EventType, "aggregate_type": e.AggregateType,
			"aggregate_id": e.AggregateID, "content_type": e.ContentType} {
			if got := attr(m, name); got != want {
				t.Errorf("event %d: attribute %s = %q, want %q", i, name, got, want)
			}
			if dt := aws.ToString(m.MessageAttributes[name].DataType); dt != "String" {
				t.Errorf("event %d: attribute %s has DataType %q, want String", i, name, dt)
			}
		}
		wantRows := map[string]string{}
		for k, v := range e.Headers {
			if k != "message_id" {
				wantRows[k] = v
			}
		}
		if got := rowHeaders(t, m); !equalMaps(got, wantRows) {
			t.Errorf("event %d: row headers %v, want %v", i, got, wantRows)
		}
		if g := m.Attributes["MessageGroupId"]; g != fifoID(e.AggregateID) {
			t.Errorf("event %d: MessageGroupId %q, want %q", i, g, fifoID(e.AggregateID))
		}
		if d := m.Attributes["MessageDeduplicationId"]; d != e.ID {
			t.Errorf("event %d: MessageDeduplicationId %q, want %q", i, d, e.ID)
		}
	}
	if g := fifoID(batch[1].AggregateID); !strings.HasPrefix(g, "aggregate_id_with_spaces-") {
		t.Errorf("group of an aggregate id with spaces: %q", g)
	}

}

func TestPublishStandardQueue(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "events", nil)
	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{})
	batch := []*event.Event{testEvent(1, "order", "o-1"), testEvent(2, "order", "o-2")}
	for range 2 {
		if err := s.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	msgs := receiveAll(t, c, url)
	if len(msgs) != 4 {
		t.Fatalf("received %d messages, want 4 (a standard queue keeps duplicates)", len(msgs))
	}
	for _, m := range msgs {
		if g, ok := m.Attributes["MessageGroupId"]; ok {
			t.Errorf("message on a standard queue has MessageGroupId %q", g)
		}
		if attr(m, "message_id") == "" || attr(m, "aggregate_id") == "" {
			t.Errorf("message attributes %v", m.MessageAttributes)
		}
	}
}

func TestBatchSplitting(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "split.fifo", nil)
	rec := newRecorder(t, srv.Endpoint())

	events := func(n, payload int) []*event.Event {
		out := make([]*event.Event, n)
		for i := range out {
			out[i] = testEvent(i+n*1000+payload, "order", fmt.Sprint("a-", i))
			out[i].Payload = bytes.Repeat([]byte("x"), payload)
			out[i].ContentType = event.ContentTypeText
		}
		return out
	}
	// sizes returns, per SendMessageBatch request, the entries and the
	// bytes SQS counts against its limit.
	sizes := func() (entries, bytes []int) {
		for _, r := range rec.take("SendMessageBatch") {
			b := decodeBatch(t, r.body)
			n := 0
			for _, e := range b.Entries {
				n += len(e.MessageBody)
				for k, v := range e.MessageAttributes {
					n += len(k) + len(v.DataType) + len(v.StringValue)
				}
			}
			entries, bytes = append(entries, len(b.Entries)), append(bytes, n)
		}
		slices.Sort(entries)
		return entries, bytes
	}

	s := newTestSink(t, rec.srv.URL, Config{QueueURL: url}, Options{})
	if err := s.Publish(context.Background(), events(25, 10)); err != nil {
		t.Fatal(err)
	}
	if got, _ := sizes(); !slices.Equal(got, []int{5, 10, 10}) {
		t.Errorf("25 small events went out in requests of %v entries, want [5 10 10]", got)
	}

	// 100 KiB each: two fit in the default 256 KiB.
	if err := s.Publish(context.Background(), events(5, 100<<10)); err != nil {
		t.Fatal(err)
	}
	got, b := sizes()
	if !slices.Equal(got, []int{1, 2, 2}) {
		t.Errorf("5 events of 100 KiB went out in requests of %v entries, want [1 2 2]", got)
	}
	for _, n := range b {
		if n > defaultMaxBatchBytes {
			t.Errorf("a request of %d bytes, over the default max_batch_bytes %d", n, defaultMaxBatchBytes)
		}
	}

	// max_batch_bytes 1024: events of 300 bytes (and their attributes),
	// two per request; one of 2000 bytes alone.
	small := newTestSink(t, rec.srv.URL, Config{QueueURL: url, MaxBatchBytes: 1024}, Options{})
	batch := append(events(4, 300), events(1, 2000)...)
	if err := small.Publish(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	got, b = sizes()
	if !slices.Equal(got, []int{1, 2, 2}) {
		t.Errorf("with max_batch_bytes 1024: requests of %v entries (%v bytes), want [1 2 2]", got, b)
	}
	if n := len(receiveAll(t, c, url)); n != 25+5+5 {
		t.Errorf("received %d messages, want %d", n, 35)
	}
}

// TestOversizedEntryAlone sends a batch with one message over the queue's
// MaximumMessageSize: that event fails as permanent, the others are
// acknowledged. SQS rejects such an entry alone; the emulator rejects the
// whole request, so the sink sends each entry again on its own.
func TestOversizedEntryAlone(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "small.fifo", map[string]string{"MaximumMessageSize": "1024"})
	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{})

	batch := []*event.Event{testEvent(1, "order", "o-1"), testEvent(2, "order", "o-2"), testEvent(3, "order", "o-3")}
	batch[1].Payload = bytes.Repeat([]byte("x"), 2000)
	err := s.Publish(context.Background(), batch)
	if got := sinktest.Classes(err, 3); !slices.Equal(got, []string{"ok", "suspect-permanent", "ok"}) {
		t.Fatalf("classes %v, want [ok suspect-permanent ok]: %v", got, err)
	}
	if !strings.Contains(sink.Failed(err, 1).Error(), "InvalidParameterValue") {
		t.Errorf("error of the oversized entry: %v", sink.Failed(err, 1))
	}
	msgs := receiveAll(t, c, url)
	if len(msgs) != 2 || attr(msgs[0], "message_id") == batch[1].ID || attr(msgs[1], "message_id") == batch[1].ID {
		t.Errorf("received %d messages, want the 2 good ones", len(msgs))
	}
}

// TestEntryFailures checks the handling of a SendMessageBatch answer that
// accepts some entries and rejects others, from a server that answers like
// SQS: a sender fault is permanent (suspect), an internal error and
// throttling unavailable, and only the failed events are published again.
func TestEntryFailures(t *testing.T) {
	var mu sync.Mutex
	failing := map[string]string{ // message_id -> code to fail with, once
		"00000000-0000-4000-8000-000000000002": "InvalidMessageContents",
		"00000000-0000-4000-8000-000000000003": "InternalError",
		"00000000-0000-4000-8000-000000000004": "RequestThrottled",
	}
	var sent []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in batchRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		type ok struct{ Id, MessageId, MD5OfMessageBody string }
		type failed struct {
			Id, Code, Message string
			SenderFault       bool
		}
		var out struct {
			Successful []ok
			Failed     []failed
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range in.Entries {
			id := e.MessageAttributes["message_id"].StringValue
			sent = append(sent, id)
			if code, bad := failing[id]; bad {
				delete(failing, id)
				out.Failed = append(out.Failed, failed{e.Id, code, "test", code == "InvalidMessageContents"})
				continue
			}
			sum := md5.Sum([]byte(e.MessageBody))
			out.Successful = append(out.Successful, ok{e.Id, "m-" + e.Id, hex.EncodeToString(sum[:])})
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()
	s := newTestSink(t, srv.URL, Config{QueueURL: srv.URL + "/123456789012/q.fifo"}, Options{})

	batch := make([]*event.Event, 5)
	for i := range batch {
		batch[i] = testEvent(i+1, "order", fmt.Sprint("o-", i))
	}
	err := s.Publish(context.Background(), batch)
	if got := sinktest.Classes(err, 5); !slices.Equal(got, []string{"ok", "suspect-permanent", "unavailable", "unavailable", "ok"}) {
		t.Fatalf("classes %v, want [ok suspect-permanent unavailable unavailable ok]: %v", got, err)
	}
	var retry []*event.Event
	for i, e := range batch {
		if f := sink.Failed(err, i); f != nil && fault.ClassOf(f) != fault.Permanent {
			retry = append(retry, e)
		}
	}
	if err := s.Publish(context.Background(), retry); err != nil {
		t.Fatalf("retry of the failed events: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 7 || sent[5] != batch[2].ID || sent[6] != batch[3].ID {
		t.Errorf("sent %v, want the 5 events, then the 2 retryable failures alone", sent)
	}
}

// TestMalformedRequestRetriedAlone makes SQS reject a whole request
// (BatchRequestTooLong, with max_batch_bytes set beyond what the server
// takes): the sink sends each entry again on its own and all succeed.
func TestMalformedRequestRetriedAlone(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "big", nil)
	rec := newRecorder(t, srv.Endpoint())
	// New does not validate the config (the loader does): 4 MiB goes
	// beyond the emulator's 1 MiB request limit.
	s := newTestSink(t, rec.srv.URL, Config{QueueURL: url, MaxBatchBytes: 4 << 20}, Options{})
	batch := make([]*event.Event, 6)
	for i := range batch {
		batch[i] = testEvent(i, "order", fmt.Sprint("o-", i))
		batch[i].Payload = bytes.Repeat([]byte("y"), 300<<10)
		batch[i].ContentType = event.ContentTypeText
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatalf("%v: %v", sinktest.Classes(err, len(batch)), err)
	}
	var entries []int
	for _, r := range rec.take("SendMessageBatch") {
		entries = append(entries, len(decodeBatch(t, r.body).Entries))
	}
	if !slices.Equal(entries, []int{6, 1, 1, 1, 1, 1, 1}) {
		t.Errorf("requests of %v entries, want one of 6 rejected, then 6 of 1", entries)
	}
	if n := len(receiveAll(t, c, url)); n != 6 {
		t.Errorf("received %d messages, want 6", n)
	}
}

func TestQueueTemplate(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	orders := createQueue(t, c, "tpl-order.fifo", nil)
	invoices := createQueue(t, c, "tpl-invoice_v2"+template.Hash("invoice.v2")+".fifo", nil) // "." is not allowed
	rec := newRecorder(t, srv.Endpoint())
	s := newTestSink(t, rec.srv.URL, Config{Queue: "tpl-{aggregate_type}.fifo"}, Options{})
	ctx := context.Background()

	for round := range 3 {
		batch := []*event.Event{
			testEvent(round*10+1, "order", "o-1"),
			testEvent(round*10+2, "invoice.v2", "i-1"),
			testEvent(round*10+3, "order", "o-2"),
		}
		if err := s.Publish(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Probe(ctx, "tpl-refund.fifo"); fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("Probe of a missing queue = %v, want unavailable", err)
	}
	for _, dest := range []string{"tpl-order.fifo", sink.Broker} {
		if err := s.Probe(ctx, dest); err != nil {
			t.Errorf("Probe(%s) = %v", dest, err)
		}
	}
	if n := len(rec.take("GetQueueUrl")); n != 3 {
		t.Errorf("%d GetQueueUrl requests for 2 queues over 3 publishes, want 2 (cached)", n)
	}
	if o, i := len(receiveAll(t, c, orders)), len(receiveAll(t, c, invoices)); o != 6 || i != 3 {
		t.Errorf("received %d orders and %d invoices, want 6 and 3", o, i)
	}

	// A missing queue fails its events only, as a failure of that
	// destination, and is looked up again on the next publish; Probe
	// reports it.
	batch := []*event.Event{testEvent(101, "order", "o-1"), testEvent(102, "refund", "r-1")}
	for range 2 {
		err := s.Publish(ctx, batch)
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{"ok", "unavailable"}) {
			t.Fatalf("classes %v, want [ok unavailable]: %v", got, err)
		}
		if d := s.DestinationOf(batch[1]); d != "tpl-refund.fifo" {
			t.Errorf("DestinationOf = %q", d)
		}
		if !strings.Contains(sink.Failed(err, 1).Error(), "tpl-refund.fifo") {
			t.Errorf("error does not name the queue: %v", sink.Failed(err, 1))
		}
	}
	if err := s.Probe(ctx, "tpl-refund.fifo"); fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("Probe of a missing queue = %v, want unavailable", err)
	}
	for _, dest := range []string{"tpl-order.fifo", sink.Broker} {
		if err := s.Probe(ctx, dest); err != nil {
			t.Errorf("Probe(%s) = %v", dest, err)
		}
	}
	if n := len(rec.take("GetQueueUrl")); n != 3 {
		t.Errorf("%d GetQueueUrl requests for a missing queue over 2 publishes, want 2 (failures not cached)", n)
	}
	refunds := createQueue(t, c, "tpl-refund.fifo", nil)
	if err := s.Publish(ctx, batch[1:]); err != nil {
		t.Fatalf("after creating the queue: %v", err)
	}
	if n := len(receiveAll(t, c, refunds)); n != 1 {
		t.Errorf("received %d refunds, want 1", n)
	}

	// A queue deleted after it was resolved: unavailable, and forgotten.
	if _, err := c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(orders)}); err != nil {
		t.Fatal(err)
	}
	rec.take("")
	err := s.Publish(ctx, []*event.Event{testEvent(201, "order", "o-1")})
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" {
		t.Fatalf("publish to a deleted queue: %v, want unavailable", err)
	}
	createQueue(t, c, "tpl-order.fifo", nil)
	if err := s.Publish(ctx, []*event.Event{testEvent(201, "order", "o-1")}); err != nil {
		t.Fatalf("after re-creating the queue: %v", err)
	}
	if n := len(rec.take("GetQueueUrl")); n != 1 {
		t.Errorf("%d GetQueueUrl requests after the queue was deleted, want 1", n)
	}

	// A value that would make the name longer than 80 characters is cut
	// and ended by its hash.
	long := strings.Repeat("x", 80)
	cut := "tpl-" + strings.Repeat("x", 80-len("tpl-.fifo")-template.HashLen) + template.Hash(long) + ".fifo"
	longs := createQueue(t, c, cut, nil)
	if err := s.Publish(ctx, []*event.Event{testEvent(301, long, "x-1")}); err != nil {
		t.Fatalf("queue name cut to 80 characters: %v", err)
	}
	if n := len(receiveAll(t, c, longs)); n != 1 {
		t.Errorf("received %d messages on %s, want 1", n, cut)
	}
}

func TestUnreachableEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + ln.Addr().String()
	ln.Close()

	for _, cfg := range []Config{
		{QueueURL: endpoint + "/000000000000/q.fifo"},
		{Queue: "q-{aggregate_type}"},
	} {
		s := newTestSink(t, endpoint, cfg, Options{})
		start := time.Now()
		err := s.Publish(context.Background(), []*event.Event{testEvent(1, "order", "o-1"), testEvent(2, "order", "o-2")})
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{"unavailable", "unavailable"}) {
			t.Errorf("%+v: classes %v, want unavailable: %v", cfg, got, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("%+v: Publish to a closed port took %v", cfg, d)
		}
		if err := s.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "sink.sqs.endpoint") {
			t.Errorf("%+v: Check = %v, want an error pointing at sink.sqs.endpoint", cfg, err)
		}
	}
}

func TestCancelAndClose(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	url := createQueue(t, c, "cx.fifo", nil)
	batch := []*event.Event{testEvent(1, "order", "o-1"), testEvent(2, "order", "o-2")}

	s := newTestSink(t, srv.Endpoint(), Config{QueueURL: url}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := sinktest.Classes(s.Publish(ctx, batch), 2); !slices.Equal(got, []string{"unavailable", "unavailable"}) {
		t.Errorf("cancelled context: %v, want unavailable", got)
	}
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Errorf("publish after a cancelled one: %v", err)
	}

	// Close ends a publish stuck on a stalled connection.
	p, err := testenv.StartProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Stall()
	stalled := newTestSink(t, "http://"+p.Addr(), Config{QueueURL: url}, Options{})
	done := make(chan error, 1)
	go func() { done <- stalled.Publish(context.Background(), batch) }()
	time.Sleep(200 * time.Millisecond)
	stalled.Close()
	select {
	case err := <-done:
		if got := sinktest.Classes(err, 2); !slices.Equal(got, []string{"unavailable", "unavailable"}) || !errors.Is(sink.Failed(err, 0), errClosed) {
			t.Errorf("publish ended by Close: %v (%v), want unavailable, sink closed", err, got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Publish still running 5s after Close")
	}
	if err := stalled.Publish(context.Background(), batch); !errors.Is(sink.Failed(err, 0), errClosed) {
		t.Errorf("publish after Close: %v", err)
	}
	if err := stalled.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCheck(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	fifo := createQueue(t, c, "chk.fifo", nil)
	createQueue(t, c, "present-order", nil)
	ctx := context.Background()
	check := func(cfg Config) error {
		return newTestSink(t, srv.Endpoint(), cfg, Options{}).Check(ctx)
	}

	for _, ok := range []Config{
		{QueueURL: fifo},
		{Queue: "chk.fifo"},
		{Queue: "present-{aggregate_type}"},
		{Queue: "{aggregate_type}"},
	} {
		if err := check(ok); err != nil {
			t.Errorf("Check(%+v) = %v", ok, err)
		}
	}
	for cfg, want := range map[Config][]string{
		{QueueURL: srv.Endpoint() + "/123456789012/gone.fifo"}: {"does not exist", "create-queue --queue-name gone.fifo --attributes FifoQueue=true"},
		{Queue: "gone"}:                      {"does not exist", "create-queue --queue-name gone"},
		{Queue: "absent-{aggregate_type}"}:   {`no sqs queue name starts with "absent-"`},
		{Queue: "chk-{aggregate_type}.fifo"}: {`no sqs queue name starts with "chk-"`},
	} {
		err := check(cfg)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Check(%+v) = %v, want an error containing %q", cfg, err, w)
			}
		}
	}

	// The default credential chain with nothing to find, and the instance
	// metadata endpoint disabled so that nothing leaves the machine.
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
		"AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	s, err := New(ctx, Config{Region: testRegion, Endpoint: srv.Endpoint(), QueueURL: fifo}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("Check without credentials = %v, want an error naming AWS_ACCESS_KEY_ID", err)
	}
	err = s.Publish(ctx, []*event.Event{testEvent(1, "order", "o-1")})
	if got := sinktest.Classes(err, 1); got[0] != "unavailable" {
		t.Errorf("publish without credentials: %v (%v), want unavailable", err, got)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{QueueURL: "https://sqs.us-east-1.amazonaws.com/1/q", Queue: "q"},
		{QueueURL: "not a url"},
		{Queue: "outbox.{aggregate_type}"},
		{Queue: "outbox-{nope}"},
	} {
		cfg.Region = testRegion
		if s, err := New(context.Background(), cfg, Options{Credentials: testCreds}); err == nil {
			s.Close()
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	s := newTestSink(t, "http://127.0.0.1:1", Config{Queue: "outbox-{aggregate_type}.fifo"}, Options{})
	if d := s.Destination(); d != "sqs FIFO queues named by template outbox-{aggregate_type}.fifo" {
		t.Errorf("Destination() = %q", d)
	}
}

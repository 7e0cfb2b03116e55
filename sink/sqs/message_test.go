package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// attrsOf returns the attributes of m as name -> value (Binary values as
// their bytes), with the data type prefixed for Binary ones.
// testRows is the sink's row header filter.
var testRows = sink.NewHeaderFilter(sink.SQSRules, "", nil)

func attrsOf(m message) map[string]string {
	out := map[string]string{}
	for k, v := range m.attrs {
		if aws.ToString(v.DataType) == binaryType {
			out[k] = "Binary:" + string(v.BinaryValue)
		} else {
			out[k] = aws.ToString(v.StringValue)
		}
	}
	return out
}

func TestNewMessageBodyAndAttributes(t *testing.T) {
	base := func() *event.Event {
		return &event.Event{ID: "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", AggregateType: "order", AggregateID: "o-1",
			EventType: "order.created", Payload: []byte(`{"a": 1}`), ContentType: event.ContentTypeJSON}
	}
	contract := func(e *event.Event) map[string]string {
		return map[string]string{"message_id": e.ID, "event_type": e.EventType, "aggregate_type": e.AggregateType,
			"aggregate_id": e.AggregateID, "content_type": e.ContentType}
	}
	with := func(m map[string]string, kv ...string) map[string]string {
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}

	t.Run("json", func(t *testing.T) {
		e := base()
		e.Headers = map[string]string{"trace_id": "t-1", "message_id": "spoofed", "content_type": "spoofed"}
		m := newMessage(e, false, testRows)
		if m.body != `{"a": 1}` {
			t.Errorf("body %q", m.body)
		}
		if got, want := attrsOf(m), with(contract(e), "trace_id", "t-1"); !equalMaps(got, want) {
			t.Errorf("attributes %v, want %v", got, want)
		}
		if m.groupID != "" || m.dedupID != "" {
			t.Errorf("standard queue message has group %q, dedup %q", m.groupID, m.dedupID)
		}
		wantSize := len(m.body)
		for k, v := range attrsOf(m) {
			wantSize += len(k) + len("String") + len(v)
		}
		if m.size != wantSize {
			t.Errorf("size %d, want %d", m.size, wantSize)
		}
	})
	t.Run("fifo", func(t *testing.T) {
		e := base()
		m := newMessage(e, true, testRows)
		if m.groupID != e.AggregateID || m.dedupID != e.ID {
			t.Errorf("group %q, dedup %q; want %q, %q", m.groupID, m.dedupID, e.AggregateID, e.ID)
		}
		entry := m.entry("3")
		if aws.ToString(entry.Id) != "3" || aws.ToString(entry.MessageGroupId) != e.AggregateID || aws.ToString(entry.MessageDeduplicationId) != e.ID {
			t.Errorf("entry %+v", entry)
		}
	})
	t.Run("binary", func(t *testing.T) {
		e := base()
		e.Payload, e.ContentType = []byte("plain but bytea"), event.ContentTypeBinary
		m := newMessage(e, false, testRows)
		if m.body != "cGxhaW4gYnV0IGJ5dGVh" || attrsOf(m)["body_encoding"] != "base64" {
			t.Errorf("body %q, attributes %v; want base64 of the bytea payload", m.body, attrsOf(m))
		}
	})
	t.Run("text_sqs_cannot_carry", func(t *testing.T) {
		for _, p := range []string{"a\x01b", "bad utf-8 \xff", "\uffff", "nul\x00"} {
			e := base()
			e.Payload, e.ContentType = []byte(p), event.ContentTypeText
			m := newMessage(e, false, testRows)
			if attrsOf(m)["body_encoding"] != "base64" {
				t.Errorf("payload %q: body %q, body_encoding %q; want base64", p, m.body, attrsOf(m)["body_encoding"])
			}
		}
		e := base()
		e.Payload, e.ContentType = []byte("tab\t, lines\r\n, ünï 🚚"), event.ContentTypeText
		if m := newMessage(e, false, testRows); m.body != string(e.Payload) || attrsOf(m)["body_encoding"] != "" {
			t.Errorf("text SQS can carry was encoded: %q %v", m.body, attrsOf(m))
		}
	})
	t.Run("empty", func(t *testing.T) {
		e := base()
		e.Payload, e.AggregateType, e.EventType = nil, "", ""
		m := newMessage(e, false, testRows)
		want := map[string]string{"message_id": e.ID, "aggregate_id": e.AggregateID, "content_type": e.ContentType, "body_encoding": "empty"}
		if m.body != "-" || !equalMaps(attrsOf(m), want) {
			t.Errorf("body %q, attributes %v; want \"-\" and %v (empty values left out)", m.body, attrsOf(m), want)
		}
	})
	t.Run("binary_attribute_values", func(t *testing.T) {
		e := base()
		e.AggregateID = "ctl\x01"
		e.Headers = map[string]string{"bell": "\a"}
		got := attrsOf(newMessage(e, false, testRows))
		if got["aggregate_id"] != "Binary:ctl\x01" || got["bell"] != "Binary:\a" {
			t.Errorf("attributes %v; want Binary values for text SQS cannot carry", got)
		}
	})
	t.Run("headers_that_fit", func(t *testing.T) {
		e := base()
		e.Headers = map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5"}
		got := attrsOf(newMessage(e, false, testRows))
		if len(got) != 10 || got["h5"] != "5" {
			t.Errorf("5 headers with 5 contract attributes: %v; want 10 attributes", got)
		}
	})
	t.Run("trace_context_in_headers_json", func(t *testing.T) {
		e := base()
		e.Payload = []byte{0xff}
		e.Headers = map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4",
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "v=1"}
		m := newMessage(e, false, testRows)
		got := attrsOf(m)
		want := headersJSON(map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4"})
		if !m.headerJSON || got["headers"] != want || got["traceparent"] != e.Headers["traceparent"] || got["tracestate"] != "v=1" || len(got) > maxAttributes {
			t.Errorf("attributes %v; want traceparent and tracestate as attributes of their own beside the other headers' JSON %s", got, want)
		}
	})
	headersJSONCases := []struct {
		name    string
		headers map[string]string
		payload []byte // nil keeps the JSON payload
	}{
		{"too_many", map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5", "h6": "6"}, nil},
		{"five_with_body_encoding", map[string]string{"h1": "1", "h2": "2", "h3": "3", "h4": "4", "h5": "5"}, []byte{0xff}},
		{"bad_name", map[string]string{"x y": "1"}, nil},
		{"amazon_prefix", map[string]string{"amazonTrace": "1"}, nil},
		{"dots", map[string]string{"a..b": "1"}, nil},
		{"leading_dot", map[string]string{".a": "1"}, nil},
		{"named_headers", map[string]string{"headers": "1"}, nil},
		{"empty_value", map[string]string{"e": ""}, nil},
		{"long_name", map[string]string{strings.Repeat("n", 257): "1"}, nil},
	}
	for _, c := range headersJSONCases {
		t.Run("headers_json/"+c.name, func(t *testing.T) {
			e := base()
			e.Headers = map[string]string{"message_id": "dropped"}
			for k, v := range c.headers {
				e.Headers[k] = v
			}
			if c.payload != nil {
				e.Payload = c.payload
			}
			m := newMessage(e, false, testRows)
			got := attrsOf(m)
			if !m.headerJSON || got["headers"] != headersJSON(c.headers) {
				t.Errorf("attributes %v; want all row headers in one JSON attribute %s", got, headersJSON(c.headers))
			}
			if got["message_id"] != e.ID {
				t.Errorf("message_id %q, want %q", got["message_id"], e.ID)
			}
			if len(got) > maxAttributes {
				t.Errorf("%d attributes, over SQS's %d", len(got), maxAttributes)
			}
		})
	}
	t.Run("dropped", func(t *testing.T) {
		e := base()
		e.Headers = map[string]string{"AWS.trace": "1", "amazon.X": "1", "BODY_ENCODING": "1", "Message_ID": "1", "ok": "1"}
		if got := attrsOf(newMessage(e, false, testRows)); got["ok"] != "1" || len(got) != 6 {
			t.Errorf("attributes %v; want the contract's and ok", got)
		}
	})
	if got := headersJSON(map[string]string{"b": "<&>\x01\"", "a": "ü"}); got != `{"a":"ü","b":"<&>\u0001\""}` {
		t.Errorf("headersJSON = %s", got)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestFIFOID(t *testing.T) {
	valid := []string{"o-1", "6f1c0c52-3f3e-4f5e-9f4a-1b2c3d4e5f60", `!"#$%&'()*+,-./:;<=>?@[\]^_{|}~` + "`", strings.Repeat("a", 128)}
	for _, v := range valid {
		if got := fifoID(v); got != v {
			t.Errorf("fifoID(%q) = %q, want it unchanged", v, got)
		}
	}
	seen := map[string]string{}
	for _, v := range []string{"", " ", "a b", "a\tb", "ünï", strings.Repeat("a", 129), strings.Repeat("a", 130), strings.Repeat("ü", 200), "a_b"} {
		got := fifoID(v)
		if got != fifoID(v) {
			t.Errorf("fifoID(%q) is not deterministic", v)
		}
		if len(got) < 1 || len(got) > 128 || strings.IndexFunc(got, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			t.Errorf("fifoID(%q) = %q is not a valid SQS ID", v, got)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("fifoID(%q) = fifoID(%q) = %q", v, prev, got)
		}
		seen[got] = v
	}
	if got := fifoID("a b"); !strings.HasPrefix(got, "a_b-") || len(got) != len("a_b-")+16 {
		t.Errorf("fifoID(\"a b\") = %q, want a_b- and 16 hex digits", got)
	}
}

func TestSplit(t *testing.T) {
	items := func(sizes ...int) []*item {
		out := make([]*item, len(sizes))
		for i, s := range sizes {
			out[i] = &item{i: i, msg: message{size: s}}
		}
		return out
	}
	indexes := func(chunks []chunk) [][]int {
		var out [][]int
		for _, c := range chunks {
			var ix []int
			for _, it := range c.items {
				ix = append(ix, it.i)
			}
			out = append(out, ix)
		}
		return out
	}
	seq := func(from, to int) []int {
		var out []int
		for i := from; i < to; i++ {
			out = append(out, i)
		}
		return out
	}
	ones := make([]int, 25)
	for i := range ones {
		ones[i] = 1
	}
	cases := []struct {
		name  string
		sizes []int
		max   int
		want  [][]int
	}{
		{"ten_per_request", ones, 1000, [][]int{seq(0, 10), seq(10, 20), seq(20, 25)}},
		{"bytes", []int{400, 400, 400, 100, 700, 300}, 1000, [][]int{{0, 1}, {2, 3}, {4, 5}}},
		{"exact", []int{500, 500, 500}, 1000, [][]int{{0, 1}, {2}}},
		{"oversized_alone", []int{10, 5000, 10, 10}, 1000, [][]int{{0}, {1}, {2, 3}}},
		{"none", nil, 1000, nil},
	}
	for _, c := range cases {
		got := indexes(split(queueRef{}, items(c.sizes...), c.max))
		if !slices.EqualFunc(got, c.want, slices.Equal) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestCheckQueueTemplate(t *testing.T) {
	good := map[string]bool{
		"outbox-{aggregate_type}":         false,
		"outbox-{aggregate_type}.fifo":    true,
		"{aggregate_type}_{event_type}":   false,
		"orders.fifo":                     true,
		"Orders_1":                        false,
		strings.Repeat("q", 80):           false,
		strings.Repeat("q", 75) + ".fifo": true,
	}
	for tmpl, fifo := range good {
		got, err := checkQueueTemplate(tmpl)
		if err != nil || got != fifo {
			t.Errorf("checkQueueTemplate(%q) = %v, %v; want %v, nil", tmpl, got, err, fifo)
		}
	}
	for _, tmpl := range []string{"", ".fifo", "outbox.{aggregate_type}", "out box", "q.fifo.fifo", strings.Repeat("q", 81), "ünï-{aggregate_type}"} {
		if _, err := checkQueueTemplate(tmpl); err == nil {
			t.Errorf("checkQueueTemplate(%q) succeeded", tmpl)
		}
	}
	for in, want := range map[string]string{"order": "order", "a.b c/ü": "a_b_c__", "A-z_9": "A-z_9"} {
		if got := strings.Map(sanitize, in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseQueueURL(t *testing.T) {
	ref, err := parseQueueURL("https://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo")
	if err != nil || ref.name != "orders.fifo" || !ref.fifo {
		t.Errorf("FIFO URL: %+v, %v", ref, err)
	}
	ref, err = parseQueueURL("http://127.0.0.1:9324/000000000000/orders")
	if err != nil || ref.name != "orders" || ref.fifo {
		t.Errorf("standard URL: %+v, %v", ref, err)
	}
	for _, bad := range []string{"orders", "https://sqs.us-east-1.amazonaws.com/", "ftp://x/q", "://"} {
		if _, err := parseQueueURL(bad); err == nil {
			t.Errorf("parseQueueURL(%q) succeeded", bad)
		}
	}
}

// apiErr is an SQS error answer with an HTTP status.
func apiErr(code string, status int, fault smithy.ErrorFault) error {
	return &smithy.OperationError{ServiceID: "SQS", OperationName: "SendMessageBatch", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      &smithy.GenericAPIError{Code: code, Message: "test", Fault: fault},
		},
	}}
}

func TestClassify(t *testing.T) {
	s := &Sink{}
	ctx := context.Background()
	cases := []struct {
		err  error
		want fault.Class
	}{
		{apiErr("RequestThrottled", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("ThrottlingException", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("InvalidClientTokenId", 403, smithy.FaultClient), fault.Unavailable},
		{apiErr("ServiceUnavailable", 503, smithy.FaultServer), fault.Unavailable},
		{apiErr("", 502, smithy.FaultServer), fault.Unavailable},
		{apiErr("InternalError", 500, smithy.FaultServer), fault.Unavailable},
		{apiErr("QueueDoesNotExist", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("AWS.SimpleQueueService.NonExistentQueue", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("AccessDenied", 403, smithy.FaultClient), fault.Unavailable},
		{apiErr("AccessDeniedException", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("KmsDisabled", 400, smithy.FaultClient), fault.Unavailable},
		{apiErr("", 500, smithy.FaultServer), fault.Unavailable},
		{apiErr("InvalidParameterValue", 400, smithy.FaultClient), fault.Permanent},
		{apiErr("BatchRequestTooLong", 400, smithy.FaultClient), fault.Permanent},
		{apiErr("SomethingNew", 400, smithy.FaultClient), fault.Transient},
		{&smithyhttp.RequestSendError{Err: errors.New("connection refused")}, fault.Unavailable},
		{&credentialsError{errors.New("no EC2 IMDS role found")}, fault.Unavailable},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), fault.Unavailable},
	}
	for _, c := range cases {
		if got := fault.ClassOf(s.classify(ctx, c.err)); got != c.want {
			t.Errorf("classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}

	cctx, cancel := context.WithCancelCause(ctx)
	cancel(errClosed)
	if err := s.classify(cctx, context.Canceled); fault.ClassOf(err) != fault.Unavailable || !errors.Is(err, errClosed) {
		t.Errorf("classify after Close = %v (%v), want unavailable errClosed", err, fault.ClassOf(err))
	}

	entries := []struct {
		code   string
		sender bool
		want   fault.Class
	}{
		{"InvalidParameterValue", true, fault.Permanent},
		{"InvalidMessageContents", true, fault.Permanent},
		{"SomethingNew", true, fault.Permanent},
		{"InternalError", false, fault.Unavailable},
		{"SomethingNew", false, fault.Transient},
		{"RequestThrottled", true, fault.Unavailable},
		{"KmsThrottled", false, fault.Unavailable},
		{"KmsAccessDenied", true, fault.Unavailable},
	}
	for _, c := range entries {
		err := entryError(types.BatchResultErrorEntry{Code: aws.String(c.code), Id: aws.String("0"), SenderFault: c.sender, Message: aws.String("m")})
		if got := fault.ClassOf(err); got != c.want {
			t.Errorf("entry %s (sender fault %v) = %v, want %v", c.code, c.sender, got, c.want)
		}
	}
}

package sink

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestHeaderFilterReason(t *testing.T) {
	nats := NewHeaderFilter(NATSRules, "ce-", nil)
	http := NewHeaderFilter(HTTPRules, "", nil)
	sqs := NewHeaderFilter(SQSRules, "", nil)
	for _, tc := range []struct {
		f          *HeaderFilter
		name, want string
	}{
		{nats, "tenant", ""},
		{nats, "nats-msg-id", DropReserved},
		{nats, "MESSAGE_ID", DropReserved},
		{nats, "Nats-Rollup", DropControl},
		{nats, "NATS-TTL", DropControl},
		{nats, "status", DropControl},
		{nats, "CE-ID", DropReserved},
		{nats, "Nats", ""},
		{http, "ce-id", ""},
		{http, "User-Agent", DropReserved},
		{http, "webhook-signature", DropReserved},
		{http, "transfer-encoding", DropControl},
		{http, "Proxy-Authorization", DropControl},
		{http, "te", DropControl},
		{http, "Nats-Rollup", ""},
		{sqs, "aws.trace", DropControl},
		{sqs, "Amazon.X", DropControl},
		{sqs, "AWSTrace", ""},
		{sqs, "Content_Type", DropReserved},
	} {
		if got := tc.f.Reason(tc.name); got != tc.want {
			t.Errorf("%v: Reason(%q) = %q, want %q", tc.f.rules, tc.name, got, tc.want)
		}
	}
}

// TestHeaderDropsLogOncePerInterval: drops are counted each and logged at
// most once per interval and reason, the name quoted and cut.
func TestHeaderDropsLogOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	d := NewHeaderDrops(slog.New(slog.NewTextHandler(&buf, nil)))
	f := NewHeaderFilter(NATSRules, "", d)
	for range 100 {
		f.Forward("Nats-Rollup\x1b[2J" + strings.Repeat("x", 100))
		f.Forward("message_id")
		f.Forward("tenant")
	}
	if c, r := d.Count(DropControl), d.Count(DropReserved); c != 100 || r != 100 {
		t.Errorf("counted %d control and %d reserved drops, want 100 each", c, r)
	}
	out := buf.String()
	if n := strings.Count(out, "row header not forwarded"); n != 2 {
		t.Errorf("%d warnings, want one per reason:\n%s", n, out)
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, strings.Repeat("x", 60)) {
		t.Errorf("a header name logged raw or whole:\n%s", out)
	}
	var none *HeaderDrops
	NewHeaderFilter(NATSRules, "", none).Forward("Nats-TTL")
	if none.Count(DropControl) != 0 {
		t.Error("a nil HeaderDrops counted")
	}
}

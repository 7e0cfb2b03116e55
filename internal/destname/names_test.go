package destname

import (
	"strings"
	"testing"
)

func TestNATSSubject(t *testing.T) {
	for _, tc := range []struct {
		subject, err string
	}{
		{"outbox.order", ""},
		{"outbox.ünï_x-1", ""},
		{"outbox." + strings.Repeat("a", MaxNATSSubject-7), ""},
		{"outbox." + strings.Repeat("a", MaxNATSSubject-6), "bytes, over the 1024"},
		{"outbox..order", "empty token"},
		{"outbox.", "empty token"},
		{"outbox.*", "wildcard token *"},
		{"outbox.>", "wildcard token >"},
		{"out box", "whitespace"},
		{"out\x00box", "control character"},
		{"out\u00a0box", "whitespace"},
	} {
		err := NATSSubject(tc.subject)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("NATSSubject(%.20q) = %v, want %q", tc.subject, err, tc.err)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("NATSSubject(%.20q): an error of %d bytes", tc.subject, len(err.Error()))
		}
	}
}

func TestSQSQueue(t *testing.T) {
	for _, tc := range []struct {
		name, err string
	}{
		{"orders", ""},
		{"orders-v2_x.fifo", ""},
		{strings.Repeat("q", 80), ""},
		{strings.Repeat("q", 75) + ".fifo", ""},
		{strings.Repeat("q", 81), "over SQS's 80"},
		{strings.Repeat("q", 76) + ".fifo", "over SQS's 80"},
		{"", "empty"},
		{".fifo", "empty"},
		{"a.b", "characters SQS does not allow"},
		{"a b", "characters SQS does not allow"},
	} {
		err := SQSQueue(tc.name)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("SQSQueue(%.20q) = %v, want %q", tc.name, err, tc.err)
		}
	}
}

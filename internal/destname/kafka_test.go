package destname

import (
	"strings"
	"testing"
)

func TestKafkaTopicTemplate(t *testing.T) {
	for _, tc := range []struct {
		tmpl, err string
	}{
		{"orders", ""},
		{"out.{aggregate_type}", ""},
		{"{aggregate_type}", ""},
		{"a-b_c.D9", ""},
		{"", `"" is not a valid topic name`},
		{"..", `".." is not a valid topic name`},
		{"a/b", `"a/b" has characters Kafka does not allow`},
		{"out box.{aggregate_type}", "has characters Kafka does not allow"},
		{strings.Repeat("t", 250), "longer than Kafka's 249 characters"},
		{strings.Repeat("t", 250) + "{event_type}", "longer than Kafka's 249 characters"},
	} {
		err := KafkaTopicTemplate(tc.tmpl)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("KafkaTopicTemplate(%.20q) = %v, want %q", tc.tmpl, err, tc.err)
		}
	}
}

func TestKafkaTopicNamesLongName(t *testing.T) {
	err := KafkaTopic(strings.Repeat("t", 250))
	if err == nil || !strings.Contains(err.Error(), `topic "tttt`) || !strings.Contains(err.Error(), "longer than Kafka's 249") {
		t.Errorf("KafkaTopic(250 t) = %v, want the name's start and the limit", err)
	}
}

package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCloudEventsAccepts(t *testing.T) {
	c, err := Parse([]byte(sinkCase("nats", "  envelope: cloudevents\n  cloudevents:\n    source: ${CE_SOURCE}\n")), env(map[string]string{"CE_SOURCE": "urn:example:orders"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Sink.Envelope != "cloudevents" || c.Sink.CloudEvents.Source != "urn:example:orders" {
		t.Errorf("sink %+v", c.Sink)
	}
	for _, yaml := range []string{minimal, sinkCase("nats", "  envelope: none\n")} {
		c, err := Parse([]byte(yaml), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Sink.Envelope == "cloudevents" {
			t.Errorf("envelope %q", c.Sink.Envelope)
		}
	}
}

// TestCloudEventsErrors: every mistake names the key and its line (the
// sink section is on line 5, the keys added to it start on line 7).
func TestCloudEventsErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"source missing", "  envelope: cloudevents\n", 5, "sink.cloudevents.source", "required (a URI reference such as urn:example:orders"},
		{"source empty", "  envelope: cloudevents\n  cloudevents:\n    source: ${UNSET:-}\n", 9, "sink.cloudevents.source", "must not be empty"},
		{"source with space", "  envelope: cloudevents\n  cloudevents:\n    source: urn:a b\n", 9, "sink.cloudevents.source", "must not contain whitespace"},
		{"source with query", "  envelope: cloudevents\n  cloudevents:\n    source: https://h/x?y=1\n", 9, "sink.cloudevents.source", "must not have a query or fragment"},
		{"source not a URI", "  envelope: cloudevents\n  cloudevents:\n    source: \"%zz\"\n", 9, "sink.cloudevents.source", "is not a URI reference"},
		{"unknown envelope", "  envelope: json\n", 7, "sink.envelope", `must be none or cloudevents, got "json"`},
		{"empty envelope", "  envelope: \"\"\n", 7, "sink.envelope", "must not be empty (none or cloudevents)"},
		{"source without envelope", "  cloudevents:\n    source: urn:x\n", 7, "sink.cloudevents", "has no effect unless sink.envelope is cloudevents"},
		{"unknown key", "  cloudevents:\n    sources: urn:x\n", 8, "sink.cloudevents.sources", "unknown key (expected one of source)"},
		{"static ce- header", "  envelope: cloudevents\n  cloudevents:\n    source: urn:x\n  webhook:\n    url: http://h/\n    headers:\n      ce-source: x\n", 13, "sink.webhook.headers.ce-source", "the cloudevents envelope sets the Ce- headers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ := "nats"
			if strings.Contains(tt.section, "webhook:") {
				typ = "webhook"
			}
			checkLoadError(t, sinkCase(typ, tt.section), tt.line, tt.key, tt.msg)
		})
	}
}

// checkLoadError parses yaml as config.yaml and fails t unless it is
// refused with an *Error at line and key whose message starts with msg.
func checkLoadError(t *testing.T, yaml string, line int, key, msg string) {
	t.Helper()
	_, err := parse("config.yaml", []byte(yaml), env(nil))
	if err == nil {
		t.Fatal("no error")
	}
	prefix := fmt.Sprintf("config.yaml:%d: %s: ", line, key)
	if !strings.HasPrefix(err.Error(), prefix+msg) {
		t.Errorf("got  %q\nwant %q...", err, prefix+msg)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != line || e.Key != key {
		t.Errorf("errors.As: got %+v", e)
	}
}

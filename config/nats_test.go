package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// natsCase is a valid config with a nats sink whose keys are section,
// indented under sink.nats from line 8.
func natsCase(section string) string {
	return sinkCase("nats", "  nats:\n"+section)
}

func TestNATSAccepts(t *testing.T) {
	yaml := natsCase(`    url: tls://nats-1:4222
    username: relay
    password: ${NATS_PASSWORD}
    tls:
      enabled: true
      ca_file: /etc/nats/ca.pem
      cert_file: /etc/nats/client.pem
      key_file: /etc/nats/client.key
    replicas: 3
    storage: memory
    max_age: 168h
    max_bytes: 1073741824
    max_msgs: 1000000
    duplicate_window: 10m
  rate_limit:
    events_per_second: 200
    burst: 20
`)
	c, err := Parse([]byte(yaml), env(map[string]string{"NATS_PASSWORD": "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	want := NATS{
		URL: "tls://nats-1:4222", Subject: "outbox.{aggregate_type}", Stream: "OUTBOX",
		Username: "relay", Password: "s3cret",
		TLS:      TLS{Enabled: true, CAFile: "/etc/nats/ca.pem", CertFile: "/etc/nats/client.pem", KeyFile: "/etc/nats/client.key"},
		Replicas: 3, Storage: "memory", MaxAge: Duration(168 * time.Hour), MaxBytes: 1 << 30, MaxMsgs: 1000000,
		DuplicateWindow: Duration(10 * time.Minute),
	}
	if !reflect.DeepEqual(c.Sink.NATS, want) {
		t.Errorf("got  %+v\nwant %+v", c.Sink.NATS, want)
	}
	if got := c.Sink.RateLimit; got != (RateLimit{EventsPerSecond: 200, Burst: 20}) {
		t.Errorf("rate_limit: got %+v", got)
	}
	for _, auth := range []string{"    credentials_file: /etc/nats/relay.creds\n", "    nkey_file: /etc/nats/relay.nk\n", "    token: ${T}\n"} {
		if _, err := Parse([]byte(natsCase(auth)), env(map[string]string{"T": "tok"})); err != nil {
			t.Errorf("%q: %v", auth, err)
		}
	}
}

func TestNATSErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"two auth methods", "    credentials_file: a.creds\n    token: t\n", 9, "sink.nats.token",
			"set only one way to authenticate, got sink.nats.credentials_file or sink.nats.token"},
		{"nkey and user", "    nkey_file: a.nk\n    username: u\n    password: p\n", 9, "sink.nats.username", "set only one way to authenticate"},
		{"password without user", "    password: p\n", 7, "sink.nats.username", "required (the user of sink.nats.password)"},
		{"user without password", "    username: u\n", 7, "sink.nats.password", "required (use ${VAR} to read it from the environment)"},
		{"empty token", "    token: ${UNSET:-}\n", 8, "sink.nats.token", "must not be empty (remove the key to connect without it)"},
		{"empty creds", "    credentials_file: \"\"\n", 8, "sink.nats.credentials_file", "must not be empty"},
		{"tls ca without enabled", "    tls:\n      ca_file: ca.pem\n", 9, "sink.nats.tls.ca_file",
			"has no effect unless sink.nats.tls.enabled is true"},
		{"tls cert without key", "    tls:\n      enabled: true\n      cert_file: c.pem\n", 8, "sink.nats.tls.key_file",
			"required (the client key of sink.nats.tls.cert_file)"},
		{"replicas", "    replicas: 7\n", 8, "sink.nats.replicas", "must be between 1 and 5 (0 or unset: 1), got 7"},
		{"storage", "    storage: disk\n", 8, "sink.nats.storage", `must be file or memory, got "disk"`},
		{"max_bytes", "    max_bytes: -1\n", 8, "sink.nats.max_bytes", "must be at least 0 (0: unlimited), got -1"},
		{"max_msgs", "    max_msgs: -5\n", 8, "sink.nats.max_msgs", "must be at least 0 (0: unlimited), got -5"},
		{"window over max_age", "    max_age: 1m\n    duplicate_window: 2m\n", 9, "sink.nats.duplicate_window", "must be at most sink.nats.max_age (1m0s), got 2m0s"},
		{"max_age under default window", "    max_age: 1m\n", 8, "sink.nats.max_age", "is shorter than the default duplicate window (2m)"},
		{"unknown key", "    user: u\n", 8, "sink.nats.user", "unknown key (expected one of url, subject, stream, credentials_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkError(t, natsCase(tt.section), tt.line, tt.key, tt.msg) })
	}
}

func TestRateLimitErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"negative rate", "    events_per_second: -1\n", 8, "sink.rate_limit.events_per_second", "must be at least 0 (0: unlimited), got -1"},
		{"fractional rate", "    events_per_second: 0.5\n", 8, "sink.rate_limit.events_per_second", "expected an integer"},
		{"negative burst", "    events_per_second: 10\n    burst: -1\n", 9, "sink.rate_limit.burst", "must be at least 0"},
		{"burst without rate", "    burst: 10\n", 8, "sink.rate_limit.burst", "has no effect without sink.rate_limit.events_per_second"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkError(t, sinkCase("webhook", "  webhook:\n    url: http://h/x\n  rate_limit:\n"+tt.section), tt.line+2, tt.key, tt.msg)
		})
	}
}

// checkError fails unless parsing yaml fails first with key's error msg on
// line (0: no line).
func checkError(t *testing.T, yaml string, line int, key, msg string) {
	t.Helper()
	_, err := parse("config.yaml", []byte(yaml), env(nil))
	if err == nil {
		t.Fatal("no error")
	}
	t.Log(err)
	prefix := fmt.Sprintf("config.yaml:%d: ", line)
	if line == 0 {
		prefix = "config.yaml: "
	}
	if want := prefix + key + ": " + msg; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got  %q\nwant %q...", err, want)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != line || e.Key != key {
		t.Errorf("errors.As: got %+v", e)
	}
}

// TestNATSErrorsHideSecrets checks that no error about the NATS
// credentials repeats the password or token.
func TestNATSErrorsHideSecrets(t *testing.T) {
	for _, section := range []string{
		"    password: s3cret\n",
		"    token: s3cret\n    username: u\n    password: s3cret\n",
		"    token: [s3cret]\n",
		"    password: {s3cret}\n",
	} {
		_, err := Parse([]byte(natsCase(section)), env(nil))
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v", section, err)
		}
	}
}

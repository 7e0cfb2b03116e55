package config

import (
	"strings"
	"testing"
)

func TestTracingEndpoint(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:4317", "collector:4317", "[::1]:4317", "http://127.0.0.1:4318", "https://otlp.example.com/v1/traces"} {
		c, err := parse("config.yaml", []byte(minimal+"tracing:\n  otlp_endpoint: '"+ok+"'\n"), env(nil))
		if err != nil {
			t.Errorf("%s: %v", ok, err)
		} else if c.Tracing.OTLPEndpoint != ok {
			t.Errorf("%s: got %q", ok, c.Tracing.OTLPEndpoint)
		}
	}
	for _, bad := range []string{"127.0.0.1", ":4317", "collector:0", "collector:x", "ftp://collector:4318", "http://", "https://u:secret@collector:4318"} {
		_, err := parse("config.yaml", []byte(minimal+"tracing:\n  otlp_endpoint: "+bad+"\n"), env(nil))
		want := "config.yaml:8: tracing.otlp_endpoint: "
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: err = %v, want %s...", bad, err, want)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the password: %v", bad, err)
		}
	}
	if _, err := parse("config.yaml", []byte(minimal+"tracing:\n  otlp: x\n"), env(nil)); err == nil || !strings.Contains(err.Error(), "tracing.otlp") {
		t.Errorf("unknown key: err = %v", err)
	}
}

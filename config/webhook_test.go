package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/sink/webhook"
)

// webhookCase is a valid config with a webhook sink whose keys are section,
// indented under sink.webhook from line 8.
func webhookCase(section string) string {
	return sinkCase("webhook", "  webhook:\n"+section)
}

func TestWebhookAccepts(t *testing.T) {
	yaml := webhookCase(`    url: https://hooks.example.com/in/{aggregate_type}?event={event_type}&id={aggregate_id}
    timeout: 2s
    secret: ${WEBHOOK_SECRET}
    headers:
      Authorization: Bearer ${TOKEN}
      x-tenant: acme
    max_concurrency: 16
`)
	c, err := Parse([]byte(yaml), env(map[string]string{"WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "TOKEN": "t0k"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Webhook{
		URL:            "https://hooks.example.com/in/{aggregate_type}?event={event_type}&id={aggregate_id}",
		Timeout:        Duration(2 * time.Second),
		Secret:         "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		Headers:        map[string]string{"Authorization": "Bearer t0k", "x-tenant": "acme"},
		MaxConcurrency: 16,
	}
	got := c.Sink.Webhook
	if got.URL != want.URL || got.Timeout != want.Timeout || got.Secret != want.Secret ||
		!maps.Equal(got.Headers, want.Headers) || got.MaxConcurrency != want.MaxConcurrency {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	c, err = Parse([]byte(webhookCase("    url: http://127.0.0.1:8080/hook\n")), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Sink.Webhook; w.Timeout.D() != 5*time.Second || w.Secret != "" || w.Headers != nil || w.MaxConcurrency != 0 {
		t.Errorf("defaults: %+v", w)
	}
}

// TestWebhookIgnoredForOtherSinks checks that webhook keys are not validated
// when another sink is selected.
func TestWebhookIgnoredForOtherSinks(t *testing.T) {
	yaml := sinkCase("nats", "  webhook:\n    url: ftp://{aggregate_type}\n    secret: \"\"\n    max_concurrency: -1\n")
	if _, err := Parse([]byte(yaml), env(nil)); err != nil {
		t.Fatal(err)
	}
}

func TestWebhookErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"url missing", "    timeout: 1s\n", 7, "sink.webhook.url", "required"},
		{"url empty", "    url: ${UNSET:-}\n", 8, "sink.webhook.url", "must not be empty"},
		{"relative url", "    url: /hook/{aggregate_type}\n", 8, "sink.webhook.url", "must be an absolute http or https URL"},
		{"scheme", "    url: ftp://h/{aggregate_type}\n", 8, "sink.webhook.url", `the scheme must be http or https, got "ftp"`},
		{"placeholder in host", "    url: https://{aggregate_type}.example.com/in\n", 8, "sink.webhook.url", "placeholders are allowed only in the path and query, not in the scheme or host"},
		{"placeholder in port", "    url: \"http://h:{aggregate_id}/\"\n", 8, "sink.webhook.url", "placeholders are allowed only in the path and query"},
		{"no host", "    url: http:///{aggregate_type}\n", 8, "sink.webhook.url", "the URL has no host"},
		{"fragment", "    url: http://h/in#{event_type}\n", 8, "sink.webhook.url", "a URL fragment (#...) is never sent"},
		{"bad url", "    url: \"http://h:port/x\"\n", 8, "sink.webhook.url", "not a valid URL: "},
		{"unknown placeholder", "    url: http://h/{id}\n", 8, "sink.webhook.url", "template \"http://h/{id}\": unknown placeholder {id}"},
		{"secret empty", "    url: http://h/\n    secret: ${UNSET:-}\n", 9, "sink.webhook.secret", "must not be empty (remove the key to send unsigned requests)"},
		{"secret short", "    url: http://h/\n    secret: fifteen-bytes!!\n", 9, "sink.webhook.secret", "too short: the secret is 15 bytes, at least 16 are needed"},
		{"secret short whsec", "    url: http://h/\n    secret: whsec_c2hvcnQ=\n", 9, "sink.webhook.secret", "too short: the decoded key is 5 bytes"},
		{"secret bad base64", "    url: http://h/\n    secret: whsec_!!not-base64-but-long\n", 9, "sink.webhook.secret", "the part after whsec_ is not valid base64"},
		{"header name", "    url: http://h/\n    headers:\n      \"bad name\": x\n", 10, "sink.webhook.headers.bad name", "not a valid HTTP header name"},
		{"header reserved", "    url: http://h/\n    headers:\n      idempotency-key: x\n", 10, "sink.webhook.headers.idempotency-key", "Idempotency-Key is set by the relay or by HTTP itself"},
		{"header contract", "    url: http://h/\n    headers:\n      message_id: x\n", 10, "sink.webhook.headers.message_id", "Message_id is set by the relay"},
		{"header hop-by-hop", "    url: http://h/\n    headers:\n      Connection: close\n", 10, "sink.webhook.headers.Connection", "Connection is set by the relay or by HTTP itself"},
		{"header value", "    url: http://h/\n    headers:\n      X-A: \"a\\nb\"\n", 10, "sink.webhook.headers.X-A", "the value has a control character"},
		{"headers not a map", "    url: http://h/\n    headers: [a]\n", 9, "sink.webhook.headers", "expected a mapping, got a list"},
		{"concurrency negative", "    url: http://h/\n    max_concurrency: -1\n", 9, "sink.webhook.max_concurrency", "must be between 1 and 10000 (0 or unset: 64), got -1"},
		{"concurrency huge", "    url: http://h/\n    max_concurrency: 10001\n", 9, "sink.webhook.max_concurrency", "must be between 1 and 10000"},
		{"unknown key", "    url: http://h/\n    secret_list: x\n", 9, "sink.webhook.secret_list", "unknown key (expected one of url, timeout, secret, secrets, headers, max_concurrency, health_url)"},
		{"secret and secrets", "    url: http://h/\n    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n    secrets: [whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw]\n", 10, "sink.webhook.secrets", "set either sink.webhook.secret or sink.webhook.secrets, not both"},
		{"secrets empty", "    url: http://h/\n    secrets: []\n", 9, "sink.webhook.secrets", "must not be empty (a list of secrets"},
		{"secrets one short", "    url: http://h/\n    secrets:\n      - whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n      - ${UNSET:-}\n", 11, "sink.webhook.secrets[1]", "must not be empty"},
		{"health url placeholder", "    url: http://h/\n    health_url: http://h/{aggregate_type}\n", 9, "sink.webhook.health_url", "placeholders are not allowed"},
		{"health url scheme", "    url: http://h/\n    health_url: ftp://h/health\n", 9, "sink.webhook.health_url", "the scheme must be http or https"},
		{"health url empty", "    url: http://h/\n    health_url: \"\"\n", 9, "sink.webhook.health_url", "must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse("config.yaml", []byte(webhookCase(tt.section)), env(nil))
			if err == nil {
				t.Fatal("no error")
			}
			prefix := fmt.Sprintf("config.yaml:%d: %s: ", tt.line, tt.key)
			if tt.line == 0 {
				prefix = fmt.Sprintf("config.yaml: %s: ", tt.key)
			}
			if !strings.HasPrefix(err.Error(), prefix+tt.msg) {
				t.Errorf("got  %q\nwant %q...", err, prefix+tt.msg)
			}
			var e *Error
			if !errors.As(err, &e) || e.Line != tt.line || e.Key != tt.key {
				t.Errorf("errors.As: got %+v", e)
			}
		})
	}
}

// TestWebhookErrorsHideSecrets checks that no error repeats the secret, a
// header value or the URL's credentials.
func TestWebhookErrorsHideSecrets(t *testing.T) {
	for _, section := range []string{
		"    url: https://user:s3cr3t@{aggregate_type}/x\n",
		"    url: https://s3cr3t@h/{nope}\n",
		"    url: \"https://h:s3cr3t/x\"\n",
		"    url: ftp://h/?token=s3cr3t\n",
		"    url: http://h/\n    secret: s3cr3t\n    max_concurrency: -1\n",
		"    url: http://h/\n    secret: whsec_s3cr3t\n",
		"    url: http://h/\n    headers:\n      Authorization: \"Bearer s3cr3t\\r\"\n",
		"    url: http://h/\n    headers:\n      Content-Type: s3cr3t\n",
	} {
		_, err := Parse([]byte(webhookCase(section)), env(nil))
		if err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: %v", section, err)
		}
	}
}

// TestReservedMatchesSink checks that the config refuses, as a static
// header, exactly the headers the webhook sink refuses (in any case): the
// sink's own headers, the relay's on other sinks, the HTTP-managed and
// hop-by-hop ones; and that both accept the others, User-Agent among them.
func TestReservedMatchesSink(t *testing.T) {
	const base = "postgres:\n  url: postgres://h/db\ncapture:\n  mode: poll\nsink:\n  type: webhook\n  webhook:\n    url: http://h/\n    headers:\n      %s: v\n"
	refused := []string{
		webhook.HeaderIdempotencyKey, webhook.HeaderMessageID, webhook.HeaderEventType, webhook.HeaderAggregateType,
		webhook.HeaderAggregateID, webhook.HeaderWebhookID, webhook.HeaderWebhookTimestamp, webhook.HeaderSignature,
		"Content-Type", "Nats-Msg-Id", "content_type", "body_encoding",
		"Host", "Content-Length", "Transfer-Encoding", "Content-Encoding", "Trailer", "Te", "Expect",
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Upgrade", "HTTP2-Settings",
	}
	allowed := []string{"Authorization", "User-Agent", "X-Tenant", "traceparent"}
	for _, name := range append(refused, allowed...) {
		want := slices.Contains(refused, name)
		for _, n := range []string{name, strings.ToLower(name), strings.ToUpper(name)} {
			_, cfgErr := Parse(fmt.Appendf(nil, base, n), env(nil))
			s, sinkErr := webhook.New(webhook.Config{URL: "http://h/", Headers: map[string]string{n: "v"}}, webhook.Options{})
			if sinkErr == nil {
				s.Close()
			}
			if (cfgErr != nil) != want || (sinkErr != nil) != want {
				t.Errorf("header %s: want refused %v; the config refuses it: %v, the sink: %v", n, want, cfgErr, sinkErr)
			}
		}
	}
}

// TestWebhookSecrets checks that sink.webhook.secrets takes a list of
// secrets, each from the environment, for signing with each.
func TestWebhookSecrets(t *testing.T) {
	yaml := webhookCase("    url: http://h/\n    secrets: [${NEW}, ${OLD}]\n")
	c, err := Parse([]byte(yaml), env(map[string]string{"NEW": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "OLD": "a raw secret of 24 bytes"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Sink.Webhook.Secrets; !slices.Equal(got, []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "a raw secret of 24 bytes"}) {
		t.Errorf("secrets %q", got)
	}
}

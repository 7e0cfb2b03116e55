package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	whsig "github.com/outboxrelay/relay/helpers/webhook"

	"github.com/outboxrelay/relay/event"
)

// TestDocSnippet checks that docs/webhook.md shows the helpers' verifier
// example as it is compiled in helpers/webhook/example_test.go.
func TestDocSnippet(t *testing.T) {
	doc, err := os.ReadFile("../../docs/webhook.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../helpers/webhook/example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(src), "func Example() {\n")
	body = body[:strings.LastIndex(body, "}")]
	var snippet strings.Builder
	for line := range strings.Lines(body) {
		snippet.WriteString(strings.TrimPrefix(line, "\t"))
	}
	if !strings.Contains(string(doc), "```go\n"+snippet.String()+"```") {
		t.Errorf("docs/webhook.md does not show the example of helpers/webhook:\n%s", snippet.String())
	}
}

// testSecret is a whsec_ secret of 24 random-looking bytes.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestSignature publishes signed events and checks each request with the
// helpers' verifier and with HMAC-SHA256 computed here from the Standard
// Webhooks definition; two events with the same body sent in the same
// second have different signatures, and a request re-sent as another event
// id does not verify.
func TestSignature(t *testing.T) {
	v, err := whsig.NewVerifier(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {})
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}", Secret: testSecret})
	batch := testEvents(4)
	batch[1].Payload = []byte{0, 1, 2, 0xff}
	batch[1].ContentType = event.ContentTypeBinary
	batch[2].Payload = nil
	batch[3].Payload = batch[0].Payload
	for {
		if err := s.Publish(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
		reqs := rc.requests()
		first, same := reqs[len(reqs)-4], reqs[len(reqs)-1]
		if first.Header.Get(whsig.HeaderTimestamp) == same.Header.Get(whsig.HeaderTimestamp) {
			break // the two equal bodies were signed in the same second
		}
	}
	byID := map[string]request{}
	for _, r := range rc.requests()[len(rc.requests())-4:] {
		byID[r.Header.Get(whsig.HeaderID)] = r
	}
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(testSecret, "whsec_"))
	for _, e := range batch {
		r, ok := byID[e.ID]
		if !ok {
			t.Fatalf("no request with webhook-id %s", e.ID)
		}
		if err := v.Verify(r.Header, r.Body); err != nil {
			t.Errorf("event %s: the helpers' verifier: %v", e.ID, err)
		}
		m := hmac.New(sha256.New, key)
		m.Write([]byte(e.ID + "." + r.Header.Get(whsig.HeaderTimestamp) + "."))
		m.Write(e.Payload)
		if want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil)); r.Header.Get(whsig.HeaderSignature) != want {
			t.Errorf("event %s: signature %q, computed %q", e.ID, r.Header.Get(whsig.HeaderSignature), want)
		}
	}
	a, b := byID[batch[0].ID], byID[batch[3].ID]
	if a.Header.Get(whsig.HeaderSignature) == b.Header.Get(whsig.HeaderSignature) {
		t.Errorf("two events with the same body in the same second share the signature %s", a.Header.Get(whsig.HeaderSignature))
	}
	replay := a.Header.Clone()
	replay.Set(whsig.HeaderID, batch[3].ID)
	replay.Set(HeaderIdempotencyKey, batch[3].ID)
	if err := v.Verify(replay, a.Body); err == nil {
		t.Error("a request replayed as another event id verified")
	}

	// Without a secret there are no signature headers.
	s2 := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	if err := s2.Publish(context.Background(), testEvents(1)); err != nil {
		t.Fatal(err)
	}
	last := rc.requests()[len(rc.requests())-1]
	for _, h := range []string{whsig.HeaderID, whsig.HeaderTimestamp, whsig.HeaderSignature} {
		if last.Header.Get(h) != "" {
			t.Errorf("unsigned sink sent %s", h)
		}
	}
}

// TestShortSecret checks that New refuses a secret under 16 bytes without
// showing it.
func TestShortSecret(t *testing.T) {
	for _, secret := range []string{"fifteen-bytes!!", "whsec_c2hvcnQ="} {
		_, err := New(Config{URL: "http://127.0.0.1/x", Secret: secret}, Options{})
		if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "sink.webhook.secret") {
			t.Errorf("%q: %v", secret, err)
		}
	}
}

// TestSignedPerAttempt checks that a retry carries its own timestamp,
// signed afresh, within the tolerance.
func TestSignedPerAttempt(t *testing.T) {
	v, err := whsig.NewVerifier(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	s := newSink(t, Config{URL: rc.URL + "/x", Secret: testSecret})
	e := testEvents(1)
	_ = s.Publish(context.Background(), e)
	time.Sleep(1100 * time.Millisecond) // the next attempt falls in another second
	if err := s.Publish(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	reqs := rc.requests()
	if reqs[0].Header.Get(whsig.HeaderTimestamp) == reqs[1].Header.Get(whsig.HeaderTimestamp) {
		t.Error("the retry reused the first attempt's timestamp")
	}
	for _, r := range reqs {
		if err := v.Verify(r.Header, r.Body); err != nil {
			t.Error(err)
		}
	}
}

// TestSecretRotation checks that a sink with several secrets sends one v1
// signature per secret, space-separated, so a receiver holding either the
// new or the old secret verifies every request, and one holding neither
// does not.
func TestSecretRotation(t *testing.T) {
	const oldSecret = "0123456789abcdef0123456789abcdef" // prefix-less base64: its decoded 24 bytes are the key
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {})
	s := newSink(t, Config{URL: rc.URL + "/x", Secret: testSecret, Secrets: []string{oldSecret}})
	if err := s.Publish(context.Background(), testEvents(2)); err != nil {
		t.Fatal(err)
	}
	for _, r := range rc.requests() {
		if sigs := strings.Fields(r.Header.Get(whsig.HeaderSignature)); len(sigs) != 2 {
			t.Errorf("webhook-signature %q, want two signatures", sigs)
		}
		for _, secret := range []string{testSecret, oldSecret} {
			v, err := whsig.NewVerifier(secret)
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Verify(r.Header, r.Body); err != nil {
				t.Errorf("a receiver with secret %s: %v", secret[:6], err)
			}
		}
		other, _ := whsig.NewVerifier("whsec_" + base64.StdEncoding.EncodeToString([]byte("another key of 24 bytes!")))
		if err := other.Verify(r.Header, r.Body); err == nil {
			t.Error("a receiver with another secret verified the request")
		}
	}
}

package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
)

// The receiver's verification function of docs/webhook.md, verbatim;
// TestDocSnippet keeps the two equal.

// BEGIN doc snippet

// VerifySignature checks the Webhook-Signature header value of a request
// whose raw body is body. It fails unless the header's timestamp is within
// tolerance of now and one of its v1 signatures is the HMAC-SHA256 of
// "<t>.<body>" keyed with secret.
func VerifySignature(header string, body, secret []byte, tolerance time.Duration, now time.Time) error {
	var t string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			t = v
		case "v1":
			sigs = append(sigs, v)
		}
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return errors.New("webhook signature: no timestamp")
	}
	if age := now.Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
		return errors.New("webhook signature: timestamp outside the tolerance")
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(t + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range sigs {
		if got, err := hex.DecodeString(sig); err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("webhook signature: no valid v1 signature")
}

// END doc snippet

func TestDocSnippet(t *testing.T) {
	doc, err := os.ReadFile("../../docs/webhook.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("verify_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, snippet, _ := strings.Cut(string(src), "// BEGIN doc snippet\n\n")
	snippet, _, _ = strings.Cut(snippet, "\n// END doc snippet")
	if !strings.Contains(string(doc), snippet) {
		t.Errorf("docs/webhook.md does not contain VerifySignature as in verify_test.go:\n%s", snippet)
	}
	// The example signature in the doc.
	const header = "t=1735786800,v1=a463a072686602b6a5096a1964c9cd3682d2875d564d4ac642e54dae97905fca"
	if !strings.Contains(string(doc), header) {
		t.Error("docs/webhook.md lacks the example header")
	}
	if err := VerifySignature(header, []byte(`{"order_id": 42}`), []byte("whsec_example"), time.Minute, time.Unix(1735786800, 0)); err != nil {
		t.Errorf("the doc's example does not verify: %v", err)
	}
	if got := sign([]byte("whsec_example"), time.Unix(1735786800, 0), []byte(`{"order_id": 42}`)); got != header {
		t.Errorf("sign = %s, want %s", got, header)
	}
}

// TestSignature verifies requests of a signing sink the way docs/webhook.md
// tells receivers to.
func TestSignature(t *testing.T) {
	secret := []byte("whsec_0123456789")
	type got struct {
		header string
		body   []byte
	}
	reqs := make(chan got, 10)
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		rec, _ := io.ReadAll(r.Body)
		reqs <- got{r.Header.Get(HeaderSignature), rec}
		if err := VerifySignature(r.Header.Get(HeaderSignature), rec, secret, 5*time.Minute, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	})
	s := newSink(t, Config{URL: rc.URL + "/{aggregate_id}", Secret: string(secret)})
	batch := testEvents(3)
	batch[1].Payload = []byte{0, 1, 2, 0xff}
	batch[1].ContentType = event.ContentTypeBinary
	batch[2].Payload = nil
	if err := s.Publish(context.Background(), batch); err != nil {
		t.Fatalf("receiver rejected a signature: %v", err)
	}
	g := <-reqs
	if !strings.HasPrefix(g.header, "t=") || !strings.Contains(g.header, ",v1=") || len(g.header) != len("t=1735786800,v1=")+64 {
		t.Errorf("header %q is not t=<unix>,v1=<64 hex>", g.header)
	}
	for _, c := range []struct {
		name   string
		header string
		body   []byte
		secret []byte
		now    time.Time
	}{
		{"tampered body", g.header, append(g.body, ' '), secret, time.Now()},
		{"wrong secret", g.header, g.body, []byte("whsec_other"), time.Now()},
		{"too old", g.header, g.body, secret, time.Now().Add(6 * time.Minute)},
		{"from the future", g.header, g.body, secret, time.Now().Add(-6 * time.Minute)},
		{"no timestamp", g.header[strings.Index(g.header, ",")+1:], g.body, secret, time.Now()},
		{"other timestamp", "t=1" + g.header[strings.Index(g.header, ","):], g.body, secret, time.Unix(1, 0)},
		{"empty", "", g.body, secret, time.Now()},
	} {
		if err := VerifySignature(c.header, c.body, c.secret, 5*time.Minute, c.now); err == nil {
			t.Errorf("%s: verified", c.name)
		}
	}
	// Extra schemes and several v1 values are tolerated.
	h := "v0=abc," + strings.Replace(g.header, ",v1=", ",v1=00,v1=", 1)
	if err := VerifySignature(h, g.body, secret, 5*time.Minute, time.Now()); err != nil {
		t.Errorf("%s: %v", h, err)
	}

	// Without a secret there is no signature header.
	for range 2 {
		<-reqs
	}
	s2 := newSink(t, Config{URL: rc.URL + "/{aggregate_id}"})
	_ = s2.Publish(context.Background(), testEvents(1))
	if g := <-reqs; g.header != "" {
		t.Errorf("unsigned sink sent %s: %q", HeaderSignature, g.header)
	}
}

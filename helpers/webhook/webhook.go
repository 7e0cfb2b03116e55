// Package webhook signs and verifies webhook requests as Standard Webhooks
// (https://www.standardwebhooks.com) does. The relay's webhook sink signs
// every request with Sign; a receiver checks it with a Verifier:
//
//	v, err := webhook.NewVerifier(os.Getenv("WEBHOOK_SECRET"))
//	...
//	body, _ := io.ReadAll(r.Body)
//	if err := v.Verify(r.Header, body); err != nil {
//		http.Error(w, "bad signature", http.StatusBadRequest)
//		return
//	}
//
// A request carries three headers: webhook-id (the event's message id, the
// same on every attempt), webhook-timestamp (unix seconds of this attempt)
// and webhook-signature ("v1," and the base64 HMAC-SHA256, keyed with the
// secret, of "<id>.<timestamp>.<body>"; several space-separated signatures
// may be sent). Signing the id and the timestamp with the body means a
// captured request cannot be passed off as another event, nor replayed after
// the tolerance window. The package uses only the standard library.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

const (
	// Tolerance is how far a request's timestamp may be from the
	// receiver's clock, in the past or the future, as Standard Webhooks
	// recommends.
	Tolerance = 5 * time.Minute
	// MinSecretBytes is the shortest secret, in bytes after decoding, that
	// ParseSecret accepts.
	MinSecretBytes = 16
	// secretPrefix marks a base64-encoded secret.
	secretPrefix = "whsec_"
)

// ParseSecret returns the key bytes of a signing secret: for
// "whsec_<base64>" the decoded bytes, for any other string its own bytes.
// It fails for a key shorter than MinSecretBytes or invalid base64 after
// whsec_; its errors never contain the secret.
func ParseSecret(secret string) ([]byte, error) {
	key := []byte(secret)
	if b64, ok := strings.CutPrefix(secret, secretPrefix); ok {
		var err error
		if key, err = base64.StdEncoding.DecodeString(b64); err != nil {
			return nil, errors.New("the part after whsec_ is not valid base64")
		}
	}
	if len(key) < MinSecretBytes {
		return nil, fmt.Errorf("too short: %d bytes, at least %d are needed", len(key), MinSecretBytes)
	}
	return key, nil
}

// Sign returns the webhook-signature value of the message id sent at
// timestamp (unix seconds) with body: "v1," and the base64 HMAC-SHA256 of
// "<id>.<timestamp>.<body>" keyed with key (from ParseSecret).
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(mac(key, id, strconv.FormatInt(timestamp, 10), body))
}

// mac is the HMAC-SHA256 of "<id>.<timestamp>.<body>".
func mac(key []byte, id, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verification errors; Verify wraps one of them.
var (
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrTimestamp      = errors.New("webhook: timestamp outside the tolerance")
	ErrSignature      = errors.New("webhook: no valid v1 signature")
)

// Verifier checks the signatures of requests signed with one secret. It is
// safe for concurrent use.
type Verifier struct {
	key []byte
	// Tolerance is how far a timestamp may be from Now; default Tolerance.
	Tolerance time.Duration
	// Now returns the current time; default time.Now.
	Now func() time.Time
}

// NewVerifier returns a Verifier for secret, "whsec_<base64>" or raw, as
// ParseSecret reads it.
func NewVerifier(secret string) (*Verifier, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	return &Verifier{key: key, Tolerance: Tolerance, Now: time.Now}, nil
}

// Verify checks the request with headers h and raw body: the timestamp is
// within the tolerance of now and one of the v1 signatures is that of the
// id, timestamp and body. Deduplicate on the webhook-id only after Verify
// succeeded: it is the signed message id.
func (v *Verifier) Verify(h http.Header, body []byte) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not unix seconds", ErrTimestamp, ts)
	}
	if age := v.Now().Sub(time.Unix(sec, 0)); age > v.Tolerance || age < -v.Tolerance {
		return ErrTimestamp
	}
	want := mac(v.key, id, ts, body)
	for _, sig := range strings.Fields(sigs) {
		version, value, _ := strings.Cut(sig, ",")
		if version != "v1" {
			continue
		}
		if got, err := base64.StdEncoding.DecodeString(value); err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrSignature
}

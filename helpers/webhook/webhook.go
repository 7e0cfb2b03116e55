// Package webhook signs and verifies webhook requests as Standard Webhooks
// (https://www.standardwebhooks.com) does. The relay's webhook sink signs
// every request with Sign; a receiver checks it with a Verifier:
//
//	v, err := webhook.NewVerifier(os.Getenv("WEBHOOK_SECRET"))
//	...
//	body, _ := io.ReadAll(r.Body)
//	if err := v.Verify(r.Header, body); err != nil {
//		http.Error(w, "bad signature", http.StatusUnauthorized)
//		return
//	}
//
// Answer a bad signature with 401 Unauthorized: the relay then holds the
// URL's events and retries them, so a secret not yet deployed on one side
// loses nothing. A 400, 413 or 422 tells the relay the event itself can
// never succeed, and it dead-letters the event.
//
// A request carries three headers: webhook-id (the event's message id, the
// same on every attempt), webhook-timestamp (unix seconds of this attempt)
// and webhook-signature ("v1," and the base64 HMAC-SHA256, keyed with the
// secret, of "<id>.<timestamp>.<body>"; several space-separated signatures
// may be sent, one per secret while a secret is rotated). Signing the id and the timestamp with the body means a
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
	// MinSecretBytes is the shortest key, in bytes after decoding, that
	// ParseSecret accepts.
	MinSecretBytes = 16
	// RecommendedSecretBytes is the shortest key Standard Webhooks allows;
	// SecretAdvice warns about a shorter one.
	RecommendedSecretBytes = 24
	// secretPrefix marks a base64-encoded secret.
	secretPrefix = "whsec_"
)

// ParseSecret returns the key bytes of a signing secret, read as the
// Standard Webhooks reference libraries read it: the base64 after whsec_,
// and for a secret without that prefix the base64 it holds, when it is
// standard base64 (padding optional) of at least MinSecretBytes bytes. Any
// other secret without the prefix is a raw secret: its own bytes are the
// key, which the reference libraries cannot read (SecretAdvice says so). It
// fails for a key shorter than MinSecretBytes or invalid base64 after
// whsec_; its errors never contain the secret.
func ParseSecret(secret string) ([]byte, error) {
	key, raw, err := parseSecret(secret)
	if err != nil {
		return nil, err
	}
	if len(key) < MinSecretBytes {
		what := "the decoded key"
		if raw {
			what = "the secret"
		}
		return nil, fmt.Errorf("too short: %s is %d bytes, at least %d are needed", what, len(key), MinSecretBytes)
	}
	return key, nil
}

// parseSecret returns the key of secret and whether it is raw: without
// whsec_ and not base64 of at least MinSecretBytes bytes.
func parseSecret(secret string) (key []byte, raw bool, err error) {
	if b64, ok := strings.CutPrefix(secret, secretPrefix); ok {
		if key, err = decodeBase64(b64); err != nil {
			return nil, false, errors.New("the part after whsec_ is not valid base64")
		}
		return key, false, nil
	}
	if key, err := decodeBase64(secret); err == nil && len(key) >= MinSecretBytes {
		return key, false, nil
	}
	return []byte(secret), true, nil
}

// decodeBase64 decodes standard base64 with or without its padding, as the
// reference libraries do.
func decodeBase64(s string) ([]byte, error) {
	return base64.RawStdEncoding.DecodeString(strings.TrimSuffix(strings.TrimSuffix(s, "="), "="))
}

// SecretAdvice returns a warning about a secret ParseSecret accepts, or ""
// when there is none to give: a raw secret, which receivers using a
// Standard Webhooks library cannot verify with (they base64-decode it), or
// a key shorter than RecommendedSecretBytes. It never contains the secret.
func SecretAdvice(secret string) string {
	key, raw, err := parseSecret(secret)
	switch {
	case err != nil:
		return ""
	case raw:
		return "the secret has no whsec_ prefix and is not the base64 of 16 bytes or more, so its own bytes are the key, while Standard Webhooks libraries base64-decode it: a receiver using one cannot verify the signatures; configure whsec_ followed by the base64 of the key instead"
	case len(key) < RecommendedSecretBytes:
		return fmt.Sprintf("the key is %d bytes; Standard Webhooks asks for at least %d (generate one with: echo \"whsec_$(openssl rand -base64 32)\")", len(key), RecommendedSecretBytes)
	}
	return ""
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

// NewVerifier returns a Verifier for secret, as ParseSecret reads it: the
// same string the relay's sink.webhook.secret holds (or, while the relay
// signs with several, any one of them).
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

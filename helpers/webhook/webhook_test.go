package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test vector published by Standard Webhooks.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestStandardVector(t *testing.T) {
	key, err := ParseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	if got := Sign(key, vectorID, vectorTimestamp, []byte(vectorBody)); got != vectorSignature {
		t.Errorf("Sign = %s, want %s", got, vectorSignature)
	}
	v := verifierAt(t, vectorSecret, time.Unix(vectorTimestamp, 0))
	if err := v.Verify(headers(vectorID, vectorTimestamp, "v1,bm9wZQ== "+vectorSignature), []byte(vectorBody)); err != nil {
		t.Errorf("the vector does not verify: %v", err)
	}
}

// TestVerifyRejects checks that a request verifies only with its own id,
// timestamp, body and secret, inside the tolerance.
func TestVerifyRejects(t *testing.T) {
	const secret = "0123456789abcdef-raw"
	key, _ := ParseSecret(secret)
	now := time.Unix(1735786800, 0)
	body := []byte(`{"order_id": 42}`)
	sig := Sign(key, "id-1", now.Unix(), body)
	v := verifierAt(t, secret, now)
	if err := v.Verify(headers("id-1", now.Unix(), sig), body); err != nil {
		t.Fatalf("own request: %v", err)
	}
	for _, c := range []struct {
		name string
		h    http.Header
		body []byte
		at   time.Time
		want error
	}{
		{"replayed as another id", headers("id-2", now.Unix(), sig), body, now, ErrSignature},
		{"other timestamp", headers("id-1", now.Unix()+1, sig), body, now, ErrSignature},
		{"tampered body", headers("id-1", now.Unix(), sig), append([]byte(" "), body...), now, ErrSignature},
		{"too old", headers("id-1", now.Unix(), sig), body, now.Add(Tolerance + time.Second), ErrTimestamp},
		{"from the future", headers("id-1", now.Unix(), sig), body, now.Add(-Tolerance - time.Second), ErrTimestamp},
		{"other version", headers("id-1", now.Unix(), "v2"+sig[2:]), body, now, ErrSignature},
		{"no signature", headers("id-1", now.Unix(), ""), body, now, ErrMissingHeaders},
		{"bad timestamp", headers("id-1", 0, sig), body, now, ErrTimestamp},
	} {
		if c.name == "bad timestamp" {
			c.h.Set(HeaderTimestamp, "soon")
		}
		v.Now = func() time.Time { return c.at }
		if err := v.Verify(c.h, c.body); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	other := verifierAt(t, "whsec_"+base64.StdEncoding.EncodeToString([]byte(secret+"x")), now)
	if err := other.Verify(headers("id-1", now.Unix(), sig), body); err == nil {
		t.Error("verified with another secret")
	}
}

// TestSignIndependent checks Sign against HMAC-SHA256 computed here from
// the definition, for a raw secret and the same secret as whsec_.
func TestSignIndependent(t *testing.T) {
	raw := "a raw secret of 24 bytes"
	for _, secret := range []string{raw, "whsec_" + base64.StdEncoding.EncodeToString([]byte(raw))} {
		key, err := ParseSecret(secret)
		if err != nil {
			t.Fatal(err)
		}
		m := hmac.New(sha256.New, []byte(raw))
		m.Write([]byte("msg_1.1700000000.hello"))
		want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
		if got := Sign(key, "msg_1", 1700000000, []byte("hello")); got != want {
			t.Errorf("%s: Sign = %s, want %s", secret, got, want)
		}
	}
}

func TestParseSecret(t *testing.T) {
	for _, c := range []struct {
		secret string
		ok     bool
	}{
		{"0123456789abcdef", true},
		{"0123456789abcde", false},
		{"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 16)), true},
		{"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 15)), false},
		{"whsec_not base64 at all, but long", false},
		{"", false},
	} {
		_, err := ParseSecret(c.secret)
		if (err == nil) != c.ok {
			t.Errorf("ParseSecret(%q): %v", c.secret, err)
		}
		if err != nil && c.secret != "" && strings.Contains(err.Error(), c.secret) {
			t.Errorf("the error shows the secret: %v", err)
		}
	}
	if _, err := NewVerifier("short"); err == nil {
		t.Error("NewVerifier accepted a 5-byte secret")
	}
}

func verifierAt(t *testing.T, secret string, now time.Time) *Verifier {
	t.Helper()
	v, err := NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	v.Now = func() time.Time { return now }
	return v
}

func headers(id string, ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, sig)
	return h
}

// referenceVectors were signed by the Standard Webhooks reference library
// for JavaScript (npm standardwebhooks 1.0.0, new Webhook(secret).sign), at
// timestamp 1700000000 with id msg_2KWPBgLlAfxdpx2AI54pPJ85f4W and body
// {"order":"o-1","amount":42}. The library base64-decodes a secret with
// or without whsec_, padding optional; the last one was made with its
// format "raw" option, the only way it takes a secret that is not base64.
var referenceVectors = []struct{ secret, signature string }{
	{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "v1,guBq5E03l6A+OZe+YoDPCJDGW5rcFVOFlNh0Xd/chUw="},
	{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "v1,guBq5E03l6A+OZe+YoDPCJDGW5rcFVOFlNh0Xd/chUw="},
	{"c2VjcmV0LWtleS1vZi10d2VudHktYnl0ZXM", "v1,2FetKhHIT2D8p36HRFC47TAfRur1S45xWN1eQ9cRSKE="},
	{"c2VjcmV0LWtleS1vZi10d2VudHktYnl0ZXM=", "v1,2FetKhHIT2D8p36HRFC47TAfRur1S45xWN1eQ9cRSKE="},
	{"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "v1,DzSaf7DBu6RosThAbhAeHi2LDWybAy2oTal7FRYAyLc="},
	{"correct horse battery staple!", "v1,dpC+52U0rTiMYPhY+WkGJfuQ2JXLOrDGr8I/fJkm/Ys="},
}

// TestReferenceLibrary checks that a secret means what it means to the
// reference library: Sign makes the signature it made, and Verify accepts
// it, for the same configured string, with or without whsec_.
func TestReferenceLibrary(t *testing.T) {
	const id, ts, body = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", 1700000000, `{"order":"o-1","amount":42}`
	for _, vec := range referenceVectors {
		key, err := ParseSecret(vec.secret)
		if err != nil {
			t.Fatalf("%s: %v", vec.secret, err)
		}
		if got := Sign(key, id, ts, []byte(body)); got != vec.signature {
			t.Errorf("%s: Sign = %s, the reference library signs %s", vec.secret, got, vec.signature)
		}
		v := verifierAt(t, vec.secret, time.Unix(ts, 0))
		if err := v.Verify(headers(id, ts, "v1,bm90IGl0 "+vec.signature), []byte(body)); err != nil {
			t.Errorf("%s: Verify of the reference signature: %v", vec.secret, err)
		}
	}
}

// TestSecretAdvice checks the warnings about secrets ParseSecret accepts:
// one the reference libraries cannot read, one shorter than 24 bytes, and
// none for a whsec_ secret of 24 bytes or more.
func TestSecretAdvice(t *testing.T) {
	for _, c := range []struct{ secret, want string }{
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ""},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ""},
		{"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 16)), "the key is 16 bytes; Standard Webhooks asks for at least 24"},
		{"correct horse battery staple!", "no whsec_ prefix"},
		{"0123456789abcdef", "no whsec_ prefix"},
	} {
		got := SecretAdvice(c.secret)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) || (got != "" && strings.Contains(got, c.secret)) {
			t.Errorf("SecretAdvice(%q) = %q, want %q", c.secret, got, c.want)
		}
	}
}

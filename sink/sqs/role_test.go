package sqs

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/sink"
)

// fakeSTS answers AssumeRole as STS does (the Query protocol, an XML
// result), handing out the n-th credentials as key ASIAROLE<n> and token
// token-<n>, valid for validity; it records each call.
type fakeSTS struct {
	srv      *httptest.Server
	validity time.Duration
	deny     bool

	mu    sync.Mutex
	calls []url.Values // the form, plus "signer": the access key id that signed it
}

func newFakeSTS(t *testing.T, validity time.Duration) *fakeSTS {
	f := &fakeSTS{validity: validity}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSTS) serve(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "AssumeRole" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	form := r.Form
	form.Set("signer", accessKey(r.Header.Get("Authorization")))
	f.mu.Lock()
	f.calls = append(f.calls, form)
	n, deny := len(f.calls), f.deny
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	if deny {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code>`+
			`<Message>not authorized to perform sts:AssumeRole</Message></Error><RequestId>r</RequestId></ErrorResponse>`)
		return
	}
	fmt.Fprintf(w, `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult>
<Credentials><AccessKeyId>ASIAROLE%[1]d</AccessKeyId><SecretAccessKey>secret-%[1]d</SecretAccessKey><SessionToken>token-%[1]d</SessionToken>
<Expiration>%[2]s</Expiration></Credentials>
<AssumedRoleUser><Arn>%[3]s</Arn><AssumedRoleId>AROA1:s</AssumedRoleId></AssumedRoleUser>
</AssumeRoleResult><ResponseMetadata><RequestId>r-%[1]d</RequestId></ResponseMetadata></AssumeRoleResponse>`,
		n, time.Now().Add(f.validity).UTC().Format(time.RFC3339), form.Get("RoleArn"))
}

func (f *fakeSTS) recorded() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.calls...)
}

// accessKey returns the access key id of a SigV4 Authorization header.
func accessKey(auth string) string {
	m := regexp.MustCompile(`Credential=([^/]+)/`).FindStringSubmatch(auth)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestAssumeRole sets Config.RoleARN with base credentials "base": the
// sink calls AssumeRole at the STS endpoint (AWS_ENDPOINT_URL_STS), signed
// with the base credentials and carrying the role, session name and
// external id; the temporary credentials STS returned (key and session
// token) sign the SQS requests, which the emulator accepts; once they
// expire, the next publish assumes the role again and signs with the new
// ones. A role STS refuses makes the destination unavailable, never the
// event's fault.
func TestAssumeRole(t *testing.T) {
	srv := startEmulator(t)
	c := newClient(srv.Endpoint())
	queue := createQueue(t, c, "assumed", nil)
	sts := newFakeSTS(t, 2*time.Second)
	t.Setenv("AWS_ENDPOINT_URL_STS", sts.srv.URL)
	rec := newRecorder(t, srv.Endpoint())
	endpoint := rec.srv.URL
	const role = "arn:aws:iam::123456789012:role/outbox-relay"
	s := newTestSink(t, endpoint, Config{QueueURL: queue, RoleARN: role, ExternalID: "ext-42", RoleSessionName: "relay-test"}, Options{})
	ctx := context.Background()

	publish := func(n int) {
		t.Helper()
		if err := s.Publish(ctx, []*event.Event{testEvent(n, "order", "o-1")}); err != nil {
			t.Fatal(err)
		}
	}
	publish(1)
	calls := sts.recorded()
	if len(calls) != 1 {
		t.Fatalf("AssumeRole called %d times, want 1", len(calls))
	}
	for k, want := range map[string]string{"RoleArn": role, "RoleSessionName": "relay-test", "ExternalId": "ext-42", "signer": "test"} {
		if got := calls[0].Get(k); got != want {
			t.Errorf("AssumeRole %s = %q, want %q", k, got, want)
		}
	}
	checkSigner(t, rec, "ASIAROLE1 token-1")
	publish(2)
	if n := len(sts.recorded()); n != 1 {
		t.Fatalf("AssumeRole called %d times while the credentials are valid, want 1", n)
	}
	// Wait until the first credentials expired; the next publish renews them.
	for expiry := time.Now().Add(2 * time.Second); time.Now().Before(expiry); time.Sleep(50 * time.Millisecond) {
	}
	rec.take("")
	publish(3)
	if n := len(sts.recorded()); n != 2 {
		t.Fatalf("AssumeRole called %d times after the credentials expired, want 2", n)
	}
	checkSigner(t, rec, "ASIAROLE2 token-2")
	if got := len(receiveAll(t, c, queue)); got != 3 {
		t.Fatalf("queue holds %d messages, want 3", got)
	}

	sts.mu.Lock()
	sts.deny = true
	sts.mu.Unlock()
	denied := newTestSink(t, endpoint, Config{QueueURL: queue, RoleARN: role}, Options{})
	err := denied.Publish(ctx, []*event.Event{testEvent(4, "order", "o-1")})
	if err := sink.Failed(err, 0); fault.ClassOf(err) != fault.Unavailable || !strings.Contains(err.Error(), "AccessDenied") ||
		!strings.Contains(err.Error(), "sink.sqs.role_arn") {
		t.Fatalf("publish with a role STS refuses: %v, want a destination failure", err)
	}
	if err := denied.Check(ctx); err == nil || !strings.Contains(err.Error(), "trusts the relay's credentials for sts:AssumeRole") {
		t.Fatalf("Check with a role STS refuses: %v", err)
	}
}

// checkSigner checks that the SendMessageBatch requests rec recorded since
// the last take were signed with want, "key token", and forgets them.
func checkSigner(t *testing.T, rec *recorder, want string) {
	t.Helper()
	reqs := rec.take("SendMessageBatch")
	if len(reqs) == 0 {
		t.Fatal("no SendMessageBatch request")
	}
	for _, r := range reqs {
		if r.signer != want {
			t.Fatalf("a SendMessageBatch request was signed with %q, want the assumed role's %q", r.signer, want)
		}
	}
}

package kafka

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOAuthBearerTokenFile checks that OAUTHBEARER sends the token of
// sink.kafka.sasl.token_file, read again for every connection, so a
// refreshed token is used from the next connection on; without a file the
// password is the token.
func TestOAuthBearerTokenFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mech, err := saslMechanism(SASL{Mechanism: "OAUTHBEARER", TokenFile: file})
	if err != nil {
		t.Fatal(err)
	}
	first := func() string {
		t.Helper()
		_, msg, err := mech.Authenticate(context.Background(), "127.0.0.1:9092")
		if err != nil {
			t.Fatal(err)
		}
		return string(msg)
	}
	if msg := first(); mech.Name() != "OAUTHBEARER" || !strings.Contains(msg, "auth=Bearer token-1\x01") {
		t.Fatalf("%s first message %q", mech.Name(), msg)
	}
	if err := os.WriteFile(file, []byte("token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := first(); !strings.Contains(msg, "auth=Bearer token-2\x01") {
		t.Fatalf("after the token file changed: %q", msg)
	}
	os.Remove(file)
	if _, _, err := mech.Authenticate(context.Background(), "127.0.0.1:9092"); err == nil || !strings.Contains(err.Error(), "token_file") {
		t.Errorf("a missing token file: %v", err)
	}
	static, err := saslMechanism(SASL{Mechanism: "OAUTHBEARER", Password: "static-token"})
	if err != nil {
		t.Fatal(err)
	}
	if _, msg, err := static.Authenticate(context.Background(), "127.0.0.1:9092"); err != nil || !strings.Contains(string(msg), "auth=Bearer static-token\x01") {
		t.Errorf("password as the token: %q %v", msg, err)
	}
}

// TestMSKIAMSigned checks AWS_MSK_IAM with credentials from the AWS SDK's
// default chain (here the environment): the first message is signed for
// the kafka-cluster service in the broker host's region with the chain's
// access key and session token.
func TestMSKIAMSigned(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
	t.Setenv("AWS_SESSION_TOKEN", "session-token-1")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	mech, err := saslMechanism(SASL{Mechanism: "AWS_MSK_IAM"})
	if err != nil {
		t.Fatal(err)
	}
	_, msg, err := mech.Authenticate(context.Background(), "b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"action":"kafka-cluster:Connect"`, `"x-amz-credential":"AKIDEXAMPLE/`, `/eu-west-1/kafka-cluster/aws4_request"`,
		`"x-amz-security-token":"session-token-1"`, `"user-agent":"outbox-relay"`, `"x-amz-signature":"`} {
		if !strings.Contains(string(msg), want) {
			t.Errorf("AWS_MSK_IAM first message lacks %s: %s", want, msg)
		}
	}
}

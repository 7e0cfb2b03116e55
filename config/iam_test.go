package config

import (
	"strings"
	"testing"
)

// TestAWSIAMAuth checks postgres.aws_iam_auth.region: accepted with a URL
// without password, refused with a password in the URL (either form) or a
// malformed region, naming the key.
func TestAWSIAMAuth(t *testing.T) {
	doc := func(url, region string) string {
		return "postgres:\n  url: " + url + "\n  aws_iam_auth:\n    region: " + region +
			"\ncapture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: nats://127.0.0.1:4222\n"
	}
	env := func(string) (string, bool) { return "", false }
	cfg, err := Parse([]byte(doc("postgres://relay@db.example:5432/app", "eu-west-1")), env)
	if err != nil || cfg.Postgres.AWSIAMAuth.Region != "eu-west-1" {
		t.Fatalf("a valid aws_iam_auth: %v %+v", err, cfg)
	}
	for _, bad := range [][2]string{
		{"postgres://relay:secret@db.example:5432/app", "eu-west-1"},
		{"postgres://relay@db.example:5432/app?password=secret", "eu-west-1"},
		{"'host=db.example user=relay password=secret'", "eu-west-1"},
		{"postgres://relay@db.example:5432/app", "Ireland"},
	} {
		_, err := Parse([]byte(doc(bad[0], bad[1])), env)
		if err == nil || !strings.Contains(err.Error(), "postgres.aws_iam_auth.region") {
			t.Errorf("url %s region %s: %v, want an error naming postgres.aws_iam_auth.region", bad[0], bad[1], err)
		}
	}
}

// TestKafkaCloudSASL checks sink.kafka.sasl with AWS_MSK_IAM (no
// credentials in the file) and OAUTHBEARER (a token file or the token as
// password).
func TestKafkaCloudSASL(t *testing.T) {
	doc := func(sasl string) string {
		return "postgres:\n  url: postgres://relay@db/app\ncapture:\n  mode: poll\nsink:\n  type: kafka\n  kafka:\n    brokers: [b-1:9098]\n    topic: t\n    sasl:\n" + sasl
	}
	env := func(string) (string, bool) { return "", false }
	for _, ok := range []string{"      mechanism: AWS_MSK_IAM\n", "      mechanism: OAUTHBEARER\n      token_file: /var/run/secrets/kafka/token\n",
		"      mechanism: OAUTHBEARER\n      password: tok\n"} {
		if _, err := Parse([]byte(doc(ok)), env); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for bad, key := range map[string]string{
		"      mechanism: AWS_MSK_IAM\n      username: u\n":                                    "sink.kafka.sasl.mechanism",
		"      mechanism: OAUTHBEARER\n":                                                       "sink.kafka.sasl.token_file",
		"      mechanism: PLAIN\n      username: u\n      password: p\n      token_file: /t\n": "sink.kafka.sasl.token_file",
	} {
		if _, err := Parse([]byte(doc(bad)), env); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", bad, err, key)
		}
	}
}

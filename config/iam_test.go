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

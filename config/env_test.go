package config

import (
	"strings"
	"testing"
)

// envSeeds are secrets with each character YAML gives a meaning to.
var envSeeds = []string{
	"s3cr3t #1", "*star", "&anchor", "!tag", "a: b", "it's", `say "hi"`, "{x}", "[x]", "|pipe", ">fold",
	"%percent", "@at", "`tick`", "two\nlines", "  padded  ", "pa ss", "# hash", "- dash", "? q", ",comma",
	"null", "123", "true", "0x1F", "~", "${NOT}", "$$", "\\back\\slash", "tab\tin",
}

// envConfig places ${S} in every kind of scalar: plain, quoted, in a flow
// mapping, in a block literal and inside a URL.
const envConfig = `postgres:
  url: postgres://app:${S}@db/app?sslmode=disable
capture:
  mode: poll
sink:
  type: kafka
  kafka:
    brokers: [k:9092]
    sasl: {mechanism: PLAIN, username: "${S}", password: ${S}}
    client_id: '${S}'
    tls:
      enabled: true
      ca_file: |
        ${S}
`

// TestEnvValuesAreNotYAML checks that a variable's value is taken whole,
// whatever YAML characters it holds: "s3cr3t #1" is not cut at the
// comment, "*star" is no alias, and a value cannot add keys or lines.
func TestEnvValuesAreNotYAML(t *testing.T) {
	for _, secret := range envSeeds {
		c, err := Parse([]byte(envConfig), env(map[string]string{"S": secret}))
		if err != nil {
			t.Errorf("%q: %v", secret, err)
			continue
		}
		checkEnvValues(t, c, secret)
	}
}

// checkEnvValues fails unless every place of envConfig holds secret.
func checkEnvValues(t *testing.T, c *Config, secret string) {
	t.Helper()
	k := c.Sink.Kafka
	if got := c.Postgres.URL; got != "postgres://app:"+secret+"@db/app?sslmode=disable" {
		t.Errorf("%q: postgres.url = %q", secret, got)
	}
	if k.SASL.Username != secret || k.ClientID != secret || k.TLS.CAFile != secret+"\n" {
		t.Errorf("%q: quoted and block values %q %q %q", secret, k.SASL.Username, k.ClientID, k.TLS.CAFile)
	}
	if plainOK(secret) && k.SASL.Password != secret {
		t.Errorf("%q: plain value %q", secret, k.SASL.Password)
	}
}

// plainOK reports whether a plain ${S} decodes as a string to exactly s:
// an empty value is null, so the key keeps its default.
func plainOK(s string) bool { return s != "" }

// TestEnvTypes checks that a plain ${VAR} is typed by its value, so
// integer, boolean and duration keys work from the environment, that an
// unset variable leaves the default, and that a quoted one stays a string.
func TestEnvTypes(t *testing.T) {
	yaml := "postgres:\n  url: postgres://app@db/app\n  max_conns: ${N}\ncapture:\n  mode: poll\n" +
		"  poll:\n    interval: ${I}\n    batch_size: ${UNSET:-}\nsink:\n  type: nats\n  nats:\n    stream: '${N}'\n"
	c, err := Parse([]byte(yaml), env(map[string]string{"N": "12", "I": "250ms"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.MaxConns != 12 || c.Capture.Poll.Interval.D().String() != "250ms" || c.Capture.Poll.BatchSize != 500 || c.Sink.NATS.Stream != "12" {
		t.Errorf("max_conns %d interval %s batch_size %d stream %q", c.Postgres.MaxConns, c.Capture.Poll.Interval.D(), c.Capture.Poll.BatchSize, c.Sink.NATS.Stream)
	}
}

// TestEnvErrorsHideValues checks that errors about a value from the
// environment show the reference, never the value, and still name the key
// and its line.
func TestEnvErrorsHideValues(t *testing.T) {
	const secret = "s3cr3t #1"
	tests := []struct{ yaml, want string }{
		{strings.Replace(minimal, "mode: poll", "mode: ${S}", 1), `line 6: capture.mode: must be wal or poll, got "${S}"`},
		{minimal + "  poll:\n    interval: ${S}\n", `line 8: capture.poll.interval: invalid duration "${S}"`},
		{minimal + "  poll:\n    batch_size: ${S:-x}\n", `line 8: capture.poll.batch_size: expected an integer, got "${S:-x}"`},
		{minimal + "  poll:\n    batch_size: *${S}\n", "line 8: capture.poll.batch_size: unknown alias *${S}"},
		{minimal + "  ${S}: 1\n", "line 7: capture.${S}: unknown key"},
		{minimal + "  poll: [${S}\n", "capture.poll: invalid YAML"},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.yaml), env(map[string]string{"S": secret}))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q:\n got %v\nwant %s", tt.yaml, err, tt.want)
		}
	}
}

// FuzzEnvSecret fuzzes the loader with a secret in every kind of scalar:
// the value is taken whole, and no error shows it.
func FuzzEnvSecret(f *testing.F) {
	for _, s := range envSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, secret string) {
		vars := env(map[string]string{"S": secret})
		if c, err := Parse([]byte(envConfig), vars); err == nil {
			checkEnvValues(t, c, secret)
		} else if len(secret) > 0 && !strings.Contains(secret, "\n") {
			t.Fatalf("%q: %v", secret, err)
		}
		bad := strings.Replace(envConfig, "mode: poll", "mode: x${S}x", 1)
		_, err := Parse([]byte(bad), vars)
		if err == nil {
			t.Fatalf("%q: capture.mode accepted", secret)
		}
		if len(secret) >= 4 && strings.Contains(err.Error(), secret) && !strings.Contains(bad, secret) {
			t.Fatalf("%q shown in %v", secret, err)
		}
	})
}

// TestEnvUnset checks that a ${VAR} without default whose variable is unset
// is an error naming the variable, the key and its line, wherever a value
// uses it, and that ${VAR:-}, a set but empty variable and a reference in a
// comment are not.
func TestEnvUnset(t *testing.T) {
	vars := env(map[string]string{"EMPTY": "", "PW": "x"})
	bad := []struct{ yaml, want string }{
		{strings.Replace(minimal, "app@localhost", "app:${PGPASSWORD}@localhost", 1),
			"line 2: postgres.url: ${PGPASSWORD} is not set (write ${PGPASSWORD:-} to allow an empty value)"},
		{minimal + "  poll:\n    batch_size: ${BATCH}\n", "line 8: capture.poll.batch_size: ${BATCH} is not set"},
		{strings.Replace(minimal, "type: nats", "type: webhook\n  webhook:\n    url: ${HOOK}/x", 1), "line 6: sink.webhook.url: ${HOOK} is not set"},
		{strings.Replace(minimal, "  url:", "  password: \"${PGPASSWORD}\"\n  url:", 1), "line 2: postgres.password: ${PGPASSWORD} is not set"},
	}
	for _, tt := range bad {
		_, err := Parse([]byte(tt.yaml), vars)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q:\n got %v\nwant %s", tt.yaml, err, tt.want)
		}
	}
	good := strings.Replace(minimal, "app@localhost", "app${UNSET:-}${EMPTY}@localhost", 1) + "# password: ${UNSET}\n"
	if c, err := Parse([]byte(good), vars); err != nil || c.Postgres.URL != "postgres://app@localhost/app" {
		t.Errorf("%q: %v", good, err)
	}
}

// TestPostgresPassword checks postgres.password: taken as is from the
// environment, and exclusive with a password in postgres.url and with
// postgres.password_file.
func TestPostgresPassword(t *testing.T) {
	const secret = "Pg S3cr3t w/rd#1?&%@"
	vars := env(map[string]string{"PGPASSWORD": secret})
	c, err := Parse([]byte(strings.Replace(minimal, "  url:", "  password: ${PGPASSWORD}\n  url:", 1)), vars)
	if err != nil || c.Postgres.Password != secret {
		t.Fatalf("password %q: %v", c.Postgres.Password, err)
	}
	bad := []struct{ yaml, want string }{
		{strings.Replace(minimal, "  url: postgres://app@", "  password: ${PGPASSWORD}\n  url: postgres://app:pw@", 1),
			"line 2: postgres.password: postgres.url carries a password too: remove it from the URL"},
		{strings.Replace(minimal, "  url: postgres://app@localhost/app", "  password_file: /run/pw\n  url: host=h password=pw", 1),
			"line 2: postgres.password_file: postgres.url carries a password too"},
		{strings.Replace(minimal, "  url:", "  password: x\n  password_file: /run/pw\n  url:", 1),
			"line 3: postgres.password_file: set postgres.password or postgres.password_file, not both"},
	}
	for _, tt := range bad {
		_, err := Parse([]byte(tt.yaml), vars)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "S3cr3t") {
			t.Errorf("%q:\n got %v\nwant %s", tt.yaml, err, tt.want)
		}
	}
}

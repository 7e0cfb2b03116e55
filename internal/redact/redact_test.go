package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// cases are every form of secret String must hide: in each input, the
// text "SECRET" (and nothing else that is secret) must not survive.
var cases = []struct{ in, want string }{
	// URL user information.
	{"postgres://u:SECRET@h/db", "postgres://u:xxxxx@h/db"},
	{"postgresql://u:SECRET@h:5432,h2:5433/db?sslmode=require", "postgresql://u:xxxxx@h:5432,h2:5433/db?sslmode=require"},
	{"postgres://:SECRET@h/db", "postgres://:xxxxx@h/db"},
	{"postgres://u:p@ss/w:rd@h/db SECRET", "postgres://u:xxxxx@h/db SECRET"[:len("postgres://u:xxxxx@h/db")] + " SECRET"},
	{"postgres://u:SEC%40RET@h/db", "postgres://u:xxxxx@h/db"},
	{"postgres://u:SECRET@h:bad port/%zz", "postgres://u:xxxxx@h:bad port/%zz"},
	{"nats://SECRET@h:4222", "nats://xxxxx@h:4222"},
	{"postgres.url postgres://app:SEC RET@127.0.0.1:5999/app: cannot parse", "postgres.url postgres://app:xxxxx@127.0.0.1:5999/app: cannot parse"},
	{"connect to postgres postgres://app:SEC'RET\"x@h/app: refused", "connect to postgres postgres://app:xxxxx@h/app: refused"},
	{"nats://h:4222: refused by user@h", "nats://h:4222: refused by user@h"},
	{"postgres://h:5432/db: no user@h", "postgres://h:5432/db: no user@h"},
	{"nats://u:SECRET@h:4222,nats://SECRET@h2:4222,nats://h3", "nats://xxxxx@h:4222,nats://xxxxx@h2:4222,nats://h3"},
	{`POST "https://SECRET@h/x": refused`, `POST "https://xxxxx@h/x": refused`},
	{"a http://x:SECRET@h and https://SECRET@g/ done", "a http://xxxxx@h and https://xxxxx@g/ done"},
	{`POST "http://u:p@h/a@b": refused`, `POST "http://xxxxx@b": refused`},
	// Query parameters.
	{"postgres://h/db?user=u&password=SECRET&sslmode=disable", "postgres://h/db?user=u&password=xxxxx&sslmode=disable"},
	{"https://h/x?a=1&token=SECRET&b=2", "https://h/x?a=1&token=xxxxx&b=2"},
	{"http://h/?api_key=SECRET&Signature=SECRET#f", "http://h/?api_key=xxxxx&Signature=xxxxx#f"},
	{"https://q.s3.amazonaws.com/o?X-Amz-Credential=SECRET&X-Amz-Signature=SECRET&X-Amz-Security-Token=SECRET",
		"https://q.s3.amazonaws.com/o?X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&X-Amz-Security-Token=xxxxx"},
	{"https://h/hook?sig=SECRET&code=SECRET&auth=SECRET", "https://h/hook?sig=xxxxx&code=xxxxx&auth=xxxxx"},
	// libpq key=value strings and environment-style settings.
	{"host=h user=u password=SECRET dbname=db", "host=h user=u password=xxxxx dbname=db"},
	{"host=h password = 'SEC RET\\' SECRET' dbname=db", "host=h password = xxxxx dbname=db"},
	{"host=h password='unterminated SECRET", "host=h password=xxxxx"},
	{"host=h PASSWORD=SECRET", "host=h PASSWORD=xxxxx"},
	{"host=h sslpassword=SECRET", "host=h sslpassword=xxxxx"},
	{"https://h/x?pw=SECRET&PWD=SECRET&db_pw=SECRET", "https://h/x?pw=xxxxx&PWD=xxxxx&db_pw=xxxxx"},
	{"AWS_SECRET_ACCESS_KEY=SECRET AWS_SESSION_TOKEN=SECRET", "AWS_SECRET_ACCESS_KEY=xxxxx AWS_SESSION_TOKEN=xxxxx"},
	{"sasl_password=SECRET,SECRET client_secret=\"SECRET\"", "sasl_password=xxxxx client_secret=xxxxx"},
	// JSON and HTTP credentials.
	{`{"user":"u","password":"SECRET","secret_access_key":"SECRET"}`, `{"user":"u","password":"xxxxx","secret_access_key":"xxxxx"}`},
	{"Authorization: Bearer SECRET", "Authorization: Bearer xxxxx"},
	{"authorization: basic SECRET==", "authorization: basic xxxxx"},
	// Nothing to hide.
	{"postgres://u@h/db", "postgres://u@h/db"},
	{"kafka://SECRET@h", "kafka://xxxxx@h"},
	{"host=h dbname=db", "host=h dbname=db"},
	{"relay.yaml:8: sink.kafka.sasl.password: required", "relay.yaml:8: sink.kafka.sasl.password: required"},
	{"", ""},
}

func TestString(t *testing.T) {
	for _, c := range cases {
		got := String(c.in)
		if got != c.want {
			t.Errorf("String(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
		if String(got) != got {
			t.Errorf("String is not idempotent on %q", got)
		}
	}
}

func TestError(t *testing.T) {
	base := errors.New("dial postgres://u:SECRET@h/db: refused")
	err := Error(fmt.Errorf("connect: %w", base))
	if strings.Contains(err.Error(), "SECRET") || !errors.Is(err, base) {
		t.Errorf("Error: %v (errors.Is %v)", err, errors.Is(err, base))
	}
	plain := errors.New("refused")
	if Error(plain) != plain || Error(nil) != nil {
		t.Error("Error changed an error without secrets")
	}
}

func TestAttr(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: Attr}))
	log.Info("connect", "url", "postgres://u:SECRET@h/db", "err", errors.New("token=SECRET"),
		"password", "SECRET", slog.Group("sink", "sasl_password", "SECRET"), "attempts", 3)
	if out := buf.String(); strings.Contains(out, "SECRET") || !strings.Contains(out, "attempts=3") {
		t.Errorf("log line: %s", out)
	}
}

// FuzzString checks that a secret placed in any of the forms of cases,
// with arbitrary text around it, never survives, and that String never
// panics and is idempotent.
func FuzzString(f *testing.F) {
	for _, c := range cases {
		f.Add(c.in, "s3cr3t")
	}
	f.Fuzz(func(t *testing.T, text, secret string) {
		out := String(text)
		if String(out) != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", text, out, String(out))
		}
		if !secretShaped(secret) {
			return
		}
		for _, tmpl := range []string{
			"postgres://u:%s@h/db", "nats://%s@h", "x?token=%s&y=1", "password=%s", `{"password":"%s"}`, "Bearer %s",
		} {
			in := strings.ReplaceAll(text, "SECRET", "") + "\n" + fmt.Sprintf(tmpl, secret) + "\n" + strings.ReplaceAll(text, "SECRET", "")
			out := strings.ReplaceAll(String(in), Mask, "\x00")
			if strings.Contains(out, secret) && !strings.Contains(strings.ReplaceAll(in, fmt.Sprintf(tmpl, secret), ""), secret) {
				t.Fatalf("secret %q survives in String(%q) = %q", secret, in, String(in))
			}
		}
	})
}

// secretShaped reports whether s looks like a password the templates of
// FuzzString can carry: at least 4 characters, none that end a value.
func secretShaped(s string) bool {
	return len(s) >= 4 && !strings.ContainsAny(s, " \t\r\n\f\v\"'`<>&#@:/\\,;\x00")
}

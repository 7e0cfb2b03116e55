package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
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
	{"host=h user=u password=Pg SECRET w/rd#1?&%: cannot parse", "host=h user=u password=xxxxx"},
	{"host=h password=SEC RET#1 dbname=db sslmode=disable", "host=h password=xxxxx dbname=db sslmode=disable"},
	{"cannot parse `host=h password=SEC&RET x`: failed (missing \"=\" after \"x\")", "cannot parse `host=h password=xxxxx"},
	{"host=h password='SEC\\'RET' x=1", "host=h password=xxxxx x=1"},
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

// FuzzRedactDSN places a password in every connection string form pgx
// accepts (URL user information, percent-encoded or not, several hosts, a
// password= query parameter, key=value quoted with escapes or unquoted,
// blanks and all) and checks that no 4 bytes of it, or of its encoded
// form, survive String, neither in the string nor in pgx's parse error
// (which echoes the string), beyond what the same text shows with a
// neutral password of the same length.
func FuzzRedactDSN(f *testing.F) {
	for _, pw := range []string{"Pg S3cr3t w/rd#1?&%@:", "s3cr3t", `it's "q" \x`, "a@b/c?d#e", "pa ss word=x"} {
		f.Add(pw)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 4 || strings.ContainsAny(pw, "\x00\n\r") {
			return
		}
		neutral := strings.Repeat("\x02", len(pw))
		for i, form := range dsnForms {
			if i >= unquotedForms && nextKey.MatchString(pw) || i == rawURLForm && (pw[0] >= '0' && pw[0] <= '9' || strings.Contains(pw, "://")) {
				continue // ambiguous: a setting, a port, or another URL in the password
			}
			for _, text := range []func(string) string{
				func(dsn string) string { return dsn },
				func(dsn string) string { return "connect to postgres " + dsn + ": refused" },
				func(dsn string) string {
					_, err := pgconn.ParseConfig(dsn)
					if err == nil {
						return ""
					}
					return err.Error()
				},
			} {
				out := String(text(form(pw)))
				shown := String(text(form(neutral))) + pgxStatic + " password=" + Mask // "rd=x" of "password=xxxxx"
				for _, secret := range []string{pw, encode(pw), quote(pw)} {
					for i := 0; i+4 <= len(secret); i++ {
						// Text of the mask and blanks alone cannot be told from the mask.
						if sub := secret[i : i+4]; strings.Trim(sub, Mask[:1]+" \t") != "" && strings.Contains(out, sub) && !strings.Contains(shown, sub) {
							t.Fatalf("%q of the password %q survives in\n%q\nfrom\n%q", sub, pw, out, text(form(pw)))
						}
					}
				}
			}
		}
	})
}

// pgxStatic is text of pgx's parse errors that a password can hold too.
const pgxStatic = "unexpected spaces found in password, use percent-encoded spaces (%20) instead; " +
	"failed to parse as keyword/value (invalid keyword/value); unterminated quoted string in connection info string; " +
	"forbidden value %00 in percent-encoded value in password"

// dsnForms are the connection string forms FuzzRedactDSN puts a password
// in; those from unquotedForms on hold it unquoted in key=value settings,
// where a password holding blanks then "key=" reads as a setting, and the
// one at rawURLForm unencoded in a URL, where a password starting with
// digits reads as a port.
var dsnForms = []func(pw string) string{
	func(pw string) string { return "postgres://u:" + encode(pw) + "@h1:5432,h2:5433/db?sslmode=disable" },
	func(pw string) string { return "postgresql://u:" + pw + "@h/db" },
	func(pw string) string {
		return "postgres://u@h/db?sslmode=disable&password=" + encode(pw) + "&application_name=x"
	},
	func(pw string) string { return "host=h1,h2 user=u password='" + quote(pw) + "' dbname=db" },
	func(pw string) string { return "host=h user=u dbname=db password = '" + quote(pw) + "'" },
	// unquotedForms:
	func(pw string) string { return "host=h user=u password=" + pw },
	func(pw string) string { return "host=h password=" + pw + " dbname=db sslmode=disable" },
}

// rawURLForm is the index of the unencoded URL form of dsnForms.
const rawURLForm = 1

// unquotedForms is the index of the first unquoted form of dsnForms.
const unquotedForms = 5

// encode percent-encodes pw for a URL.
func encode(pw string) string { return strings.ReplaceAll(url.QueryEscape(pw), "+", "%20") }

// quote escapes pw for a single-quoted key=value setting.
func quote(pw string) string { return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) }

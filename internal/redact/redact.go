// Package redact hides credentials in text before it is logged or
// returned in an error. It is a leaf package: config, the sinks and the
// commands all use it, so there is one rule for what counts as a secret.
package redact

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"
)

// Mask replaces every hidden value.
const Mask = "xxxxx"

var (
	// param matches a key=value pair (a query parameter or a libpq
	// key=value setting) whose key names a credential, e.g. password,
	// sslpassword, token, X-Amz-Signature, X-Amz-Credential, api_key,
	// client_secret, sasl_password. The value may be quoted; an unterminated
	// quote runs to the end.
	param = regexp.MustCompile(`(?i)((?:^|[\s?&;,("'])[\w.-]*(?:pass|pw|secret|token|key|sig|auth|credential|code)[\w.-]*[ \t]*=[ \t]*)('(?:\\.|[^'\n])*'?|"(?:\\.|[^"\n])*"?|[^\s&#"]*)`)
	// jsonField matches a quoted JSON field whose name names a credential.
	jsonField = regexp.MustCompile(`(?i)("[\w.-]*(?:pass|pw|secret|token|key|sig|auth|credential)[\w.-]*"[ \t]*:[ \t]*)("(?:\\.|[^"\n])*"?)`)
	// passKey matches the key of a libpq key=value password setting
	// (password, sslpassword) and what precedes it.
	passKey = regexp.MustCompile(`(?i)(?:^|[\s;,("'\x60])[\w.-]*pass[\w.-]*[ \t]*=[ \t]*`)
	// nextKey matches the blanks and key that start the next setting of a
	// libpq key=value string.
	nextKey = regexp.MustCompile(`[ \t]+[A-Za-z_][\w.-]*[ \t]*=`)
	// parseError matches the reason of a pgx connection string parse
	// error, after the string it echoes.
	parseError = regexp.MustCompile("cannot parse `[^\n]*`: [^\n]*")
	// quoted matches the text from the first to the last double quote of
	// a line: pgx quotes fragments with %q or "%s", and a fragment can hold
	// quotes.
	quoted = regexp.MustCompile(`"[^\n]*"`)
	// secretKey matches a log attribute key that names a credential.
	secretKey = regexp.MustCompile(`(?i)pass|pw|secret|token|credential`)
	// bearer matches the credentials of an HTTP Authorization value.
	bearer = regexp.MustCompile(`(?i)\b(bearer|basic)[ \t]+[^\s"',;]+`)
)

// String returns s with every credential it recognises replaced by Mask:
//   - the user information of each URL (nats://xxxxx@host, whether it is
//     user:password or a token), except a postgres URL's user name
//     (postgres://user:xxxxx@host). It runs to the last @ before the next blank,
//     quote or scheme, so an unescaped @ or / in a password does not end it
//     early, and past a blank or quote to the last @ on the line when a
//     password precedes it (postgres://u:pa ss@host); at worst more than the
//     secret is hidden;
//   - the value of every key=value pair whose key names a credential
//     (password, pw, token, secret, key, sig, auth, credential, code, in any
//     case and as part of a longer name), in query strings and libpq
//     key=value strings, quoted or not; outside a query string, the
//     unquoted value of a key naming a password runs up to the next
//     "key=" or the end of the line, as libpq would read it, so a
//     password holding blanks is hidden whole;
//   - quoted JSON fields named so, and Bearer/Basic credentials;
//   - the double-quoted fragments of pgx's connection string parse errors.
//
// It works on text alone, so it never returns the secret of an input that
// fails to parse. Secrets in a URL's path cannot be recognised.
func String(s string) string {
	if strings.Contains(s, "://") {
		s = userinfo(s)
	}
	s = passValues(s)
	s = parseErrors(s)
	s = bearer.ReplaceAllString(s, "${1} "+Mask)
	s = jsonField.ReplaceAllString(s, `${1}"`+Mask+`"`)
	return param.ReplaceAllString(s, "${1}"+Mask)
}

// passValues masks the unquoted value of every password setting of a
// libpq key=value string, which runs, as libpq reads it, up to the next
// setting: an unquoted password holding blanks is hidden whole, up to the
// next "key=" or the end of the line; a single-quoted one too, from its
// closing quote on (libpq would refuse what follows it, and pgx's error
// echoes it).
func passValues(s string) string {
	var b strings.Builder
	for {
		loc := passKey.FindStringIndex(s)
		if loc == nil {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:loc[1]])
		s = s[loc[1]:]
		if s == "" {
			continue
		}
		end := strings.IndexByte(s, '\n')
		if end < 0 {
			end = len(s)
		}
		from := 0
		if s[0] == '\'' {
			from = quoteEnd(s[:end])
		}
		if next := nextKey.FindStringIndex(s[from:end]); next != nil {
			end = from + next[0]
		}
		b.WriteString(Mask)
		s = s[end:]
	}
}

// quoteEnd returns the end of the single-quoted value s starts with
// (backslash escapes a character), or len(s) when the quote is not closed.
func quoteEnd(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '\'':
			return i + 1
		}
	}
	return len(s)
}

// parseErrors masks the double-quoted fragments of every pgx connection
// string parse error ("cannot parse `…`: …"), whose reason may quote part
// of a password that the parser took for a key, a host or a port.
func parseErrors(s string) string {
	return parseError.ReplaceAllStringFunc(s, func(m string) string {
		return quoted.ReplaceAllString(m, `"`+Mask+`"`)
	})
}

// userinfo masks the user information of every URL in s.
func userinfo(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		scheme := strings.ToLower(s[strings.LastIndexFunc(s[:i], notSchemeChar)+1 : i])
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexAny(s, " \t\r\n\"'`<>")
		if end < 0 {
			end = len(s)
		}
		if next := strings.Index(s[:end], "://"); next >= 0 {
			end = next
		}
		at := strings.LastIndexByte(s[:end], '@')
		switch {
		case at < 0: // no @: a password may hold a blank or quote before one
			at = spacedPassword(s, end)
		default: // the password may go on past a blank to a later @
			at = max(at, lastAt(s))
		}
		if at < 0 {
			continue
		}
		user, _, hasPassword := strings.Cut(s[:at], ":")
		if (scheme == "postgres" || scheme == "postgresql") && !strings.ContainsAny(user, "/?#") {
			b.WriteString(user)
			if hasPassword {
				b.WriteString(":" + Mask)
			}
		} else {
			b.WriteString(Mask)
		}
		s = s[at:]
	}
}

// spacedPassword returns the end of user information whose password holds
// a blank or a quote, as in postgres://u:pa ss@h/db, where s[:end] is the
// text up to that character: when s[:end] has a colon not followed by a
// port that ends the host (digits alone could start a password), it is the
// last @ on the line before the next URL; else -1.
func spacedPassword(s string, end int) int {
	colon := strings.IndexByte(s[:end], ':')
	if colon < 0 || isPort(s[colon+1:end]) && strings.Trim(s[colon+1:end], "0123456789") != "" {
		return -1
	}
	return lastAt(s)
}

// lastAt returns the index of the last @ on s's first line before the
// next URL, or -1.
func lastAt(s string) int {
	line, _, _ := strings.Cut(s, "\n")
	if next := strings.Index(line, "://"); next >= 0 {
		line = line[:next]
	}
	return strings.LastIndexByte(line, '@')
}

// isPort reports whether s, what follows a colon in a URL, starts with a
// port number that ends the host (or s is empty).
func isPort(s string) bool {
	digits := len(s) - len(strings.TrimLeft(s, "0123456789"))
	return digits == len(s) || digits > 0 && strings.ContainsRune("/?#:,.;)", rune(s[digits]))
}

// notSchemeChar reports whether r cannot be part of a URL scheme.
func notSchemeChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')
}

// Error returns err with its message passed through String, keeping err
// in the chain for errors.Is and errors.As; it returns err itself when
// nothing was hidden, and nil for nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if r := String(msg); r != msg {
		return &redacted{msg: r, err: err}
	}
	return err
}

// redacted is an error whose message went through String.
type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// Attr is a slog.HandlerOptions.ReplaceAttr function: it replaces the
// value of an attribute whose key names a credential by Mask, and passes
// string, error and fmt.Stringer values through String, so no log line
// carries a secret the rules of String recognise.
func Attr(_ []string, a slog.Attr) slog.Attr {
	if secretKey.MatchString(a.Key) && a.Value.Kind() != slog.KindGroup {
		a.Value = slog.StringValue(Mask)
		return a
	}
	switch a.Value.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(String(a.Value.String()))
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			a.Value = slog.StringValue(String(v.Error()))
		case fmt.Stringer:
			a.Value = slog.StringValue(String(v.String()))
		}
	}
	return a
}

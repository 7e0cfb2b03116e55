package webhook

import (
	"regexp"
	"strings"

	"github.com/outboxrelay/relay/config"
)

const redacted = "xxxxx"

// secretParam matches a query parameter whose name suggests a credential.
var secretParam = regexp.MustCompile(`(?i)([?&][^=&#]*(?:token|secret|key|sig|pass|auth|code)[^=&#]*=)[^&#\s"]*`)

// redactURL returns the URLs in s with their user information and the
// values of credential-like query parameters (token, secret, key, sig,
// password, auth, code) replaced by xxxxx. Secrets elsewhere in a URL, such
// as in its path, cannot be recognised; docs/webhook.md says to put them in
// sink.webhook.headers instead.
func redactURL(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		end := strings.IndexAny(s, "/?#\" \t\n")
		if end < 0 {
			end = len(s)
		}
		if at := strings.LastIndexByte(s[:end], '@'); at >= 0 {
			b.WriteString(redacted)
			s = s[at:]
		}
	}
	return config.RedactURL(secretParam.ReplaceAllString(b.String(), "${1}"+redacted))
}

// redactedError is an error whose message went through redactURL; it keeps
// the original in its chain for errors.Is and errors.As.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactErr returns err with the URLs in its message redacted.
func redactErr(err error) error {
	msg := err.Error()
	if r := redactURL(msg); r != msg {
		return &redactedError{msg: r, err: err}
	}
	return err
}

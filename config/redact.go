package config

import "regexp"

const redacted = "xxxxx"

var (
	// urlPassword matches "scheme://user:password@" up to the last @, since
	// an unescaped @ or / in a password must not end it early.
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:@]*):.*@`)
	// keyPassword matches password=value in key=value strings and query
	// parameters, quoted or not; it also covers sslpassword.
	keyPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:\\.|[^'])*'?|"(?:\\.|[^"])*"?|[^\s&]*)`)
)

// RedactURL returns dsn, a postgres URL or key=value connection string, with
// every password replaced by xxxxx: the one in the URL's user info and any
// password parameter. It works on text alone, so it never returns the secret
// of an input that fails to parse; at worst it hides more than the password.
func RedactURL(dsn string) string {
	dsn = urlPassword.ReplaceAllString(dsn, "${1}:"+redacted+"@")
	return keyPassword.ReplaceAllString(dsn, "${1}"+redacted)
}

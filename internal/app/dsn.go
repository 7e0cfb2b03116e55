package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/redact"
)

// reservedHint says how to give a password that holds characters a
// postgres URL reserves.
const reservedHint = "percent-encode them in the password (@ %40, / %2F, ? %3F, # %23, % %25, : %3A, blank %20), " +
	"or better, remove the password from the URL and set postgres.password (or postgres.password_file), which needs no encoding"

// quoteHint says how to give a key=value setting that holds blanks or
// quotes.
const quoteHint = `single-quote a value holding blanks, quotes or backslashes, and escape each ' and \ in it with a backslash; ` +
	`or better, remove the password from postgres.url and set postgres.password (or postgres.password_file), which needs no quoting`

// dsnProblem returns what is wrong with postgres.url, given the error of
// parsing it (nil when it parsed), or "": a postgres URL whose user
// information evidently holds characters the URL form reserves (libpq
// would read part of the password as the host, port, database or
// parameters), or the reason it cannot be parsed, with how to fix it. The
// text never holds any part of dsn.
func dsnProblem(dsn string, parseErr error) string {
	rest, isURL := strings.CutPrefix(dsn, "postgres://")
	if !isURL {
		rest, isURL = strings.CutPrefix(dsn, "postgresql://")
	}
	switch {
	case isURL && misplacedUserinfo(rest):
		return "the password (or user) holds characters a URL reserves: " + reservedHint
	case isURL && badPercent.MatchString(rest):
		return "holds a % not followed by two hex digits: " + reservedHint
	case parseErr == nil:
		return ""
	case isURL:
		return fmt.Sprintf("cannot parse as a URL (%s): %s", parseReason(parseErr), reservedHint)
	}
	return fmt.Sprintf("cannot parse as keyword/value settings (%s): %s", parseReason(parseErr), quoteHint)
}

// misplacedUserinfo reports whether rest, a postgres URL after its scheme,
// has a #, a blank or more than one @, or has its @ after the first / or ?:
// in the database name, or in the parameters while the text before them
// looks like user:password rather than host:port.
func misplacedUserinfo(rest string) bool {
	if strings.ContainsAny(rest, "# \t\r\n") || strings.Count(rest, "@") > 1 {
		return true
	}
	authority, path, params := rest, "", ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
		path, params, _ = strings.Cut(rest[i:], "?")
	}
	if strings.Contains(authority, "@") {
		return false
	}
	_, afterColon, hasColon := strings.Cut(authority, ":")
	return strings.Contains(path, "@") ||
		strings.Contains(params, "@") && hasColon && strings.Trim(afterColon, "0123456789,") != ""
}

// badPercent matches a % that starts no percent-encoded byte.
var badPercent = regexp.MustCompile(`%([^0-9A-Fa-f]|.[^0-9A-Fa-f]|.?$)`)

// parseReason returns pgx's reason for rejecting a connection string
// without the string itself, and with every quoted fragment of it (such as
// the word a key=value parser took for a key) masked by redact.String.
func parseReason(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "invalid"
	}
	c := *pe
	c.ConnString = ""
	return strings.TrimPrefix(redact.String(c.Error()), "cannot parse ``: ")
}

// target names the database of pc for messages: user, first host and
// port, and database, never the password.
func target(pc *pgconn.Config) string {
	return fmt.Sprintf("postgres://%s@%s/%s", pc.User, net.JoinHostPort(pc.Host, fmt.Sprint(pc.Port)), pc.Database)
}

// describeDB names the database of postgres.url for messages by target, or
// is "postgres.url" when dsnProblem finds it wrong: its host could then be
// part of the password.
func describeDB(pg config.Postgres) string {
	pc, err := pgconn.ParseConfig(pg.URL)
	if dsnProblem(pg.URL, err) != "" {
		return "postgres.url"
	}
	return target(pc)
}

// setPassword gives pc the password of postgres.password or
// postgres.password_file, if either is set. The file is read now, so that
// a missing one is a UsageError, and again before every connection opened
// with pc or a copy of it, so that a rotated password applies.
func setPassword(pc *pgconn.Config, pg config.Postgres) error {
	if pg.Password != "" {
		pc.Password = pg.Password
	}
	if pg.PasswordFile == "" {
		return nil
	}
	pw, err := readPassword(pg.PasswordFile)
	if err != nil {
		return &UsageError{Err: err}
	}
	pc.Password = pw
	pc.AfterNetConnect = func(_ context.Context, c *pgconn.Config, conn net.Conn) (net.Conn, error) {
		pw, err := readPassword(pg.PasswordFile)
		if err != nil {
			return nil, err
		}
		c.Password = pw
		return conn, nil
	}
	return nil
}

// readPassword returns the content of file without one trailing newline.
func readPassword(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("postgres.password_file: %w", err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	return strings.TrimSuffix(s, "\r"), nil
}

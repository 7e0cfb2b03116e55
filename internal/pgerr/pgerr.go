// Package pgerr tells PostgreSQL failures that pass by themselves (a lost
// connection, a restart, a timeout, a serialization failure) from those that
// do not: a missing privilege, table, column or schema, which need an
// operator to run a GRANT or `relay init`.
package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Lasting reports whether err carries a PostgreSQL error that retrying will
// not fix: SQLSTATE class 42 (insufficient_privilege 42501, undefined_table
// 42P01, undefined_column 42703, undefined_function 42883, …), 3F000
// invalid_schema_name and class 28 (invalid authorization). Connection
// failures, timeouts and every other class count as passing.
func Lasting(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pgconn.Timeout(err) {
		return false
	}
	return strings.HasPrefix(pe.Code, "42") || strings.HasPrefix(pe.Code, "28") || pe.Code == "3F000"
}

// LockNotAvailable reports whether err carries a PostgreSQL
// lock_not_available error (SQLSTATE 55P03): a statement gave up waiting
// for a lock at its lock_timeout, or NOWAIT found it taken.
func LockNotAvailable(err error) bool {
	pe := Of(err)
	return pe != nil && pe.Code == "55P03"
}

// RowValue reports whether err carries a PostgreSQL error that a row's
// values cause, so that writing the same row again fails the same way:
// program_limit_exceeded (SQLSTATE 54000, e.g. a value longer than an
// index row holds) or a data exception (class 22, e.g. a value too long
// for a bounded column, an invalid byte sequence).
func RowValue(err error) bool {
	pe := Of(err)
	return pe != nil && (pe.Code == "54000" || strings.HasPrefix(pe.Code, "22"))
}

// Stalled reports whether err says that the database could not be reached
// or did not answer in time: no PostgreSQL error (a lost connection, a
// client-side deadline), lock_not_available (55P03, a lock_timeout) or
// query_canceled (57014, a statement_timeout). The next statement would
// likely wait as long.
func Stalled(err error) bool {
	pe := Of(err)
	return err != nil && (pe == nil || pe.Code == "55P03" || pe.Code == "57014")
}

// Of returns the PostgreSQL error in err's chain, or nil.
func Of(err error) *pgconn.PgError {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

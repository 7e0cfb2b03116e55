package pgerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestLasting(t *testing.T) {
	for code, want := range map[string]bool{
		"42501": true, "42P01": true, "42703": true, "42883": true, "3F000": true, "28P01": true,
		"40001": false, "57P01": false, "08006": false, "53300": false, "23505": false,
	} {
		err := fmt.Errorf("claim: %w", &pgconn.PgError{Code: code})
		if got := Lasting(err); got != want {
			t.Errorf("Lasting(%s) = %v, want %v", code, got, want)
		}
	}
	if Lasting(context.DeadlineExceeded) || Lasting(errors.New("connection refused")) {
		t.Error("a timeout or a connection failure counts as lasting")
	}
}

// TestRowValue tells the failures a row's values cause from the others.
func TestRowValue(t *testing.T) {
	for code, want := range map[string]bool{
		"54000": true, "22001": true, "22021": true, "22P02": true,
		"54001": false, "42501": false, "40001": false, "23505": false, "08006": false,
	} {
		err := fmt.Errorf("dead-letter: %w", &pgconn.PgError{Code: code})
		if got := RowValue(err); got != want {
			t.Errorf("RowValue(%s) = %v, want %v", code, got, want)
		}
	}
	if RowValue(errors.New("connection refused")) {
		t.Error("a connection failure counts as the row's")
	}
}

// TestStalled tells waits and unreachable databases from failed statements.
func TestStalled(t *testing.T) {
	for code, want := range map[string]bool{"55P03": true, "57014": true, "54000": false, "42501": false, "P0001": false} {
		if got := Stalled(fmt.Errorf("archive: %w", &pgconn.PgError{Code: code})); got != want {
			t.Errorf("Stalled(%s) = %v, want %v", code, got, want)
		}
	}
	if !Stalled(context.DeadlineExceeded) || !Stalled(errors.New("connection refused")) || Stalled(nil) {
		t.Error("Stalled misjudges a deadline, a connection failure or no error")
	}
}

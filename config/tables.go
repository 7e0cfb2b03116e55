package config

import "strings"

// Column returns the outbox table's name for the contract column name: the
// outbox.columns mapping for it, or name itself.
func (o Outbox) Column(name string) string {
	if c := o.Columns[name]; c != "" {
		return c
	}
	return name
}

// SplitTable splits a table name from the config into schema and name; a
// name without a schema is in "public".
func SplitTable(qualified string) (schema, name string) {
	if s, n, ok := strings.Cut(qualified, "."); ok {
		return s, n
	}
	return "public", qualified
}

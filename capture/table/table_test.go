package table_test

import (
	"testing"

	"github.com/outboxrelay/relay/capture/table"
)

// TestParseName checks table parsing, identifiers and names in messages.
func TestParseName(t *testing.T) {
	for _, tc := range []struct{ in, ident, str string }{
		{"outbox", `"public"."outbox"`, "public.outbox"},
		{"app.outbox", `"app"."outbox"`, "app.outbox"},
		{`we"ird.Out Box`, `"we""ird"."Out Box"`, `we"ird.Out Box`},
	} {
		tb := table.ParseName(tc.in)
		if tb.Ident() != tc.ident || tb.String() != tc.str {
			t.Errorf("ParseName(%q): Ident %s, String %s; want %s, %s", tc.in, tb.Ident(), tb.String(), tc.ident, tc.str)
		}
	}
}

package schema

import "testing"

// TestNamesAndLiterals checks the pure quoting helpers: table parsing,
// identifiers and string literals.
func TestNamesAndLiterals(t *testing.T) {
	for _, tc := range []struct{ in, ident, str string }{
		{"outbox", `"public"."outbox"`, "public.outbox"},
		{"app.outbox", `"app"."outbox"`, "app.outbox"},
		{`we"ird.Out Box`, `"we""ird"."Out Box"`, `we"ird.Out Box`},
	} {
		tb := ParseTable(tc.in)
		if tb.Ident() != tc.ident || tb.String() != tc.str {
			t.Errorf("ParseTable(%q): Ident %s, String %s; want %s, %s", tc.in, tb.Ident(), tb.String(), tc.ident, tc.str)
		}
	}
	if got := Q(`a"b`); got != `"a""b"` {
		t.Errorf(`Q(a"b) = %s`, got)
	}
	for in, want := range map[string]string{"it's": `'it''s'`, `a\b`: `E'a\\b'`, "": "''"} {
		if got := Literal(in); got != want {
			t.Errorf("Literal(%q) = %s, want %s", in, got, want)
		}
	}
}

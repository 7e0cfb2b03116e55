package schema

import "testing"

// TestNamesAndLiterals checks the pure quoting helpers: identifiers and
// string literals (table.TestParseName checks table names).
func TestNamesAndLiterals(t *testing.T) {
	if got := Q(`a"b`); got != `"a""b"` {
		t.Errorf(`Q(a"b) = %s`, got)
	}
	for in, want := range map[string]string{"it's": `'it''s'`, `a\b`: `E'a\\b'`, "": "''"} {
		if got := Literal(in); got != want {
			t.Errorf("Literal(%q) = %s, want %s", in, got, want)
		}
	}
}

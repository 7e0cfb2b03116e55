package rowtext

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"order-42", 100, "order-42"},
		{"", 100, ""},
		{"é ü 日本 a\\b", 100, "é ü 日本 a\\b"},
		{"\x1b]0;title\x07", 100, `\x1b]0;title\a`},
		{"a\r\nb\tc\x00\x7f", 100, `a\r\nb\tc\x00\x7f`},
		{"bad\xff\xfe", 100, `bad\xff\xfe`},
		{"\xe2\x80", 100, `\xe2\x80`},
		{"\u009b31m \u202eevil", 100, `\u009b31m \u202eevil`},
		{strings.Repeat("x", 10), 4, "xxxx...(10 bytes)"},
		{"ééé", 4, "éé...(6 bytes)"},
		{"ééé", 3, "é...(6 bytes)"},
		{"\n\n\n\n\n\n", 4, `\n\n...(6 bytes)`},
		{"ab\n\n", 5, `ab\n...(4 bytes)`},
		{strings.Repeat("\xa6", 100), 10, `\xa6\xa6...(100 bytes)`},
		{"abcdef\xa6", 3, "abc...(7 bytes)"},
		{"abc...(100 bytes)", 3, "abc...(100 bytes)"}, // cut before: kept
		{"abcd...(100 bytes)", 3, "abc...(18 bytes)"},
		{"abc...(3 bytes)", 3, "abc...(15 bytes)"},
	} {
		if got := Clean(c.in, c.max); got != c.want {
			t.Errorf("Clean(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func TestPrefix(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 2, "ab"},
		{"é", 1, ""},
		{"aé", 2, "a"},
		{"a😀b", 4, "a"},
		{"a😀b", 5, "a😀"},
		{"\x80\x80\x80\x80\x80", 4, "\x80\x80\x80\x80"},
		{"abc", 0, ""},
		{"abc", -1, ""},
	} {
		if got := Prefix(c.in, c.n); got != c.want {
			t.Errorf("Prefix(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// TestCleanAllocates nothing for text that needs no change.
func TestCleanAllocates(t *testing.T) {
	s := strings.Repeat("order-42 é ", 5)
	if n := testing.AllocsPerRun(100, func() { _ = Clean(s, ValueBytes) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// TestCleanTwice: text cleaned again with the same bound, as a log
// handler does with an attribute the caller cleaned, keeps the original
// length in its suffix.
func TestCleanTwice(t *testing.T) {
	for _, s := range []string{strings.Repeat("x", 5000), strings.Repeat("\xa6", 5000), "a\nb" + strings.Repeat("é", 3000)} {
		once := Clean(s, ErrorBytes)
		if twice := Clean(once, ErrorBytes); twice != once {
			t.Errorf("Clean of %d bytes: %q, then %q", len(s), once[len(once)-20:], twice[len(twice)-20:])
		}
	}
}

// TestCleanEscapesWithoutAllocating: escaping costs no allocation per
// escaped byte.
func TestCleanEscapesWithoutAllocating(t *testing.T) {
	s := strings.Repeat("\xa6\n", 1024)
	if n := testing.AllocsPerRun(20, func() { _ = Clean(s, ErrorBytes) }); n > 3 {
		t.Errorf("%v allocations", n)
	}
}

// FuzzClean: whatever s holds, Clean returns valid UTF-8 without control
// or format characters, within its bound, that starts with the part of s
// that needed nothing, and leaves its own result as it is.
func FuzzClean(f *testing.F) {
	for _, s := range []string{"order", "bad\xff\xfe", "\x1b]0;title\x07", "a\nb\r\x00", "\u202e\u009b", strings.Repeat("é", 40), "\xf0\x9f\x98"} {
		f.Add(s, 16)
	}
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = max%300 + 1
		if max < 1 {
			max += 300
		}
		got := Clean(s, max)
		if !utf8.ValidString(got) || strings.ContainsFunc(got, func(r rune) bool { return !unicode.IsGraphic(r) }) {
			t.Fatalf("Clean(%q, %d) = %q", s, max, got)
		}
		if len(got) > max+len("...( bytes)")+20 {
			t.Fatalf("Clean(%q, %d) is %d bytes", s, max, len(got))
		}
		if again := Clean(got, len(got)); again != got {
			t.Fatalf("Clean(%q) = %q, not itself", got, again)
		}
		if keep := Prefix(s[:clean(s)], max); !strings.HasPrefix(got, keep) {
			t.Fatalf("Clean(%q, %d) = %q does not start with %q", s, max, got, keep)
		}
	})
}

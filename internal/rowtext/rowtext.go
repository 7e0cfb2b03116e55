// Package rowtext makes text that comes from outbox rows, or that may quote
// them (error messages, a receiver's answer), safe to show: in log lines,
// metric labels, span attributes, the dead-letter table's error column and
// the terminal. Such text may hold any bytes at any length: invalid UTF-8,
// control characters (terminal escape sequences, newlines), megabytes. It is
// a leaf package; its functions are safe for concurrent use.
package rowtext

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The bounds of row text, in bytes as shown (escapes included), by where
// it is shown.
const (
	// LabelBytes bounds a metric label value.
	LabelBytes = 64
	// ValueBytes bounds a row value in a log line, a span attribute, an HTTP
	// status page or the terminal.
	ValueBytes = 256
	// ErrorBytes bounds an error message, which may quote row values, in a
	// log line or the dead-letter table.
	ErrorBytes = 2048
)

// Label returns s as a metric label value: Clean(s, LabelBytes).
func Label(s string) string { return Clean(s, LabelBytes) }

// Value returns s as a log attribute or span attribute shows it:
// Clean(s, ValueBytes).
func Value(s string) string { return Clean(s, ValueBytes) }

// Error returns the error message s as a log line or the dead-letter table
// holds it: Clean(s, ErrorBytes).
func Error(s string) string { return Clean(s, ErrorBytes) }

// Clean returns s with every byte that is not part of a graphic UTF-8
// character escaped as Go writes it in a quoted string: control characters
// (\n, \r, \t, \x1b, \x7f, \u009b), format characters such as U+202E
// (\u202e) and invalid bytes (\xff). Backslashes are kept as they are. A
// result longer than max bytes is cut to at most max bytes, never inside a
// character or an escape, and followed by "...(N bytes)", N being s's
// length, as Cut does. The result is valid UTF-8 with no control character.
// Text that needs nothing is returned as Cut returns it, without allocating;
// text that Clean or Cut already cut to max bytes or fewer is returned as it
// is, so that cleaning twice keeps the original length in the suffix.
func Clean(s string, max int) string {
	i := clean(s)
	if i == len(s) {
		if wasCut(s, max) {
			return s
		}
		return Cut(s, max)
	}
	if i > max {
		return Prefix(s, max) + suffix(len(s))
	}
	var b strings.Builder
	b.Grow(min(len(s), max) + 24)
	b.WriteString(s[:i])
	var buf [16]byte
	for i < len(s) {
		text, n := escape(buf[:0], s[i:])
		if b.Len()+len(text) > max {
			b.WriteString(suffix(len(s)))
			break
		}
		b.Write(text)
		i += n
	}
	return b.String()
}

// escape appends the first character of s as Clean shows it to dst and
// returns the result and the character's length in s.
func escape(dst []byte, s string) ([]byte, int) {
	r, n := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && n == 1:
		const hex = "0123456789abcdef"
		return append(dst, '\\', 'x', hex[s[0]>>4], hex[s[0]&0xf]), 1
	case unicode.IsGraphic(r):
		return append(dst, s[:n]...), n
	default:
		q := strconv.AppendQuoteRune(dst, r) // '\x1b', '\n', '\u202e'
		return q[1 : len(q)-1], n
	}
}

// wasCut reports whether s is text Cut or Clean cut to at most max bytes:
// at most max bytes followed by "...(N bytes)", N larger than them.
func wasCut(s string, max int) bool {
	rest, ok := strings.CutSuffix(s, " bytes)")
	k := strings.LastIndex(rest, "...(")
	if !ok || k < 0 || k > max {
		return false
	}
	n, err := strconv.Atoi(rest[k+len("...("):])
	return err == nil && n > k
}

// clean returns the length of the longest prefix of s that Clean keeps as
// it is.
func clean(s string) int {
	i := 0
	for i < len(s) {
		if c := s[i]; c >= ' ' && c < utf8.RuneSelf && c != 0x7f {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !unicode.IsGraphic(r) {
			return i
		}
		i += n
	}
	return i
}

// Cut returns s when it is at most max bytes long, and otherwise Prefix(s,
// max) followed by "...(N bytes)", N being s's length. The suffix is ASCII,
// so the result converts to every database encoding s does.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return Prefix(s, max) + suffix(len(s))
}

// suffix returns the mark Cut puts after text cut from n bytes.
func suffix(n int) string { return "...(" + strconv.Itoa(n) + " bytes)" }

// Prefix returns the longest prefix of s that is at most n bytes long and
// does not end inside a UTF-8 character.
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	for i := n; i >= 0 && i > n-utf8.UTFMax; i-- {
		if !utf8.RuneStart(s[i]) {
			continue
		}
		if _, size := utf8.DecodeRuneInString(s[i:]); i < n && i+size > n {
			return s[:i] // s[n] is inside the character at s[i]
		}
		break
	}
	return s[:n]
}

package event

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// ParseHeaders decodes a headers column, a JSON object of strings, as
// json.Unmarshal into a map[string]string does, with the same result and
// the same errors. Objects whose keys and values have no escapes or control
// characters, as Postgres prints most jsonb, are decoded without
// reflection; anything else goes to json.Unmarshal. Every call returns a
// new map, which the caller may change. It is safe for concurrent use.
func ParseHeaders(b []byte) (map[string]string, error) {
	if h, ok := parseSimpleObject(b); ok {
		return h, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	return h, nil
}

// parseSimpleObject decodes b when it is an object of plain strings; ok is
// false for anything else. The keys and values share one string, a copy of
// b.
func parseSimpleObject(b []byte) (h map[string]string, ok bool) {
	b = trimSpace(b)
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil, false
	}
	b = trimSpace(b[1 : len(b)-1])
	s := string(b)
	h = make(map[string]string, bytes.Count(b, []byte{':'}))
	for p := 0; p < len(b); {
		var k, v string
		if k, p, ok = plainString(s, b, p); !ok {
			return nil, false
		}
		if p = skipSpace(b, p); p == len(b) || b[p] != ':' {
			return nil, false
		}
		if v, p, ok = plainString(s, b, skipSpace(b, p+1)); !ok {
			return nil, false
		}
		h[k] = v
		if p = skipSpace(b, p); p < len(b) {
			if b[p] != ',' {
				return nil, false
			}
			if p = skipSpace(b, p+1); p == len(b) {
				return nil, false // a trailing comma
			}
		}
	}
	return h, true
}

// plainString reads a JSON string without escapes or control characters
// at b[p:], and returns it (a substring of s, which holds b's bytes) and
// the position after it.
func plainString(s string, b []byte, p int) (str string, next int, ok bool) {
	if p >= len(b) || b[p] != '"' {
		return "", 0, false
	}
	ascii := true
	for i := p + 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			if !ascii && !utf8.Valid(b[p+1:i]) {
				return "", 0, false
			}
			return s[p+1 : i], i + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

// skipSpace returns the position of the first byte at or after p that is
// not JSON whitespace.
func skipSpace(b []byte, p int) int {
	for p < len(b) && isSpace(b[p]) {
		p++
	}
	return p
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// trimSpace trims JSON whitespace.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

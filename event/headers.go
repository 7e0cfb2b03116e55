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
// reflection; anything else goes to json.Unmarshal.
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
// false for anything else.
func parseSimpleObject(b []byte) (h map[string]string, ok bool) {
	b = trimSpace(b)
	if len(b) < 2 || b[0] != '{' || b[len(b)-1] != '}' {
		return nil, false
	}
	b = trimSpace(b[1 : len(b)-1])
	h = make(map[string]string, bytes.Count(b, []byte{':'}))
	for len(b) > 0 {
		var k, v string
		if k, b, ok = plainString(b); !ok {
			return nil, false
		}
		if b = trimSpace(b); len(b) == 0 || b[0] != ':' {
			return nil, false
		}
		if v, b, ok = plainString(trimSpace(b[1:])); !ok {
			return nil, false
		}
		h[k] = v
		if b = trimSpace(b); len(b) > 0 {
			if b[0] != ',' {
				return nil, false
			}
			if b = trimSpace(b[1:]); len(b) == 0 {
				return nil, false // a trailing comma
			}
		}
	}
	return h, true
}

// plainString reads a JSON string without escapes or control characters
// at the start of b, and returns it and the rest of b.
func plainString(b []byte) (s string, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", nil, false
	}
	ascii := true
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			if !ascii && !utf8.Valid(b[1:i]) {
				return "", nil, false
			}
			return string(b[1:i]), b[i+1:], true
		case c == '\\' || c < 0x20:
			return "", nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", nil, false
}

// trimSpace trims JSON whitespace.
func trimSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

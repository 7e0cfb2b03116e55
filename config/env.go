package config

import (
	"regexp"
	"strings"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expand replaces ${VAR} with the variable's value (empty when unset) and
// ${VAR:-default} with the value, or default when the variable is unset or
// empty, like the shell. $$ is a literal $. A $ that starts no well-formed
// reference, including one whose } is not on the same line, is kept as is,
// so expansion never moves a line unless a value contains a newline.
func expand(data []byte, lookupEnv func(string) (string, bool)) []byte {
	var b strings.Builder
	s := string(data)
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			b.WriteString(s)
			return []byte(b.String())
		}
		b.WriteString(s[:i])
		s = s[i:]
		n := 1
		switch s[1] {
		case '$':
			b.WriteByte('$')
			n = 2
		case '{':
			var text string
			text, n = reference(s, lookupEnv)
			b.WriteString(text)
		default:
			b.WriteByte('$')
		}
		s = s[n:]
	}
}

// reference expands the ${...} that s starts with and returns its text and
// the length of s it replaces.
func reference(s string, lookupEnv func(string) (string, bool)) (string, int) {
	end := strings.IndexAny(s, "}\n")
	if end < 0 || s[end] != '}' {
		return "${", 2
	}
	name, def, hasDef := strings.Cut(s[2:end], ":-")
	if !envName.MatchString(name) {
		return "${", 2
	}
	value, _ := lookupEnv(name)
	if value == "" && hasDef {
		value = def
	}
	return value, end + 1
}

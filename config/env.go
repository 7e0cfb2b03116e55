package config

import (
	"bytes"
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// refs are the ${VAR} and ${VAR:-default} references of one config file.
// Before the YAML is parsed each reference is replaced by a placeholder of
// letters and digits, which means the same in every YAML context; the
// decoder then puts the variable's value into the scalar that holds the
// placeholder. A value is never read as YAML, so "s3cr3t #1" stays whole and
// "*star" is no alias, and a value cannot move a line. Errors show the
// reference as written, never the value.
type refs struct {
	prefix  string
	values  *strings.Replacer // placeholder -> the variable's value
	written *strings.Replacer // placeholder -> the reference as written
	hidden  *strings.Replacer // a non-empty value -> the reference as written
	unset   map[string]string // placeholder -> name, for a ${NAME} without default whose variable is unset
}

// newRefs replaces the references in data with placeholders, and $$ with a
// literal $, and returns the text to parse. A reference is ${NAME} or
// ${NAME:-default} on one line; a $ that starts no well-formed reference
// is kept as is. The default applies when the variable is unset or empty,
// like the shell; a ${NAME} without default whose variable is unset is
// recorded, for the loader to reject where a value uses it.
func newRefs(data []byte, lookupEnv func(string) (string, bool)) (*refs, []byte) {
	r := &refs{prefix: "relayenv", unset: map[string]string{}}
	for bytes.Contains(data, []byte(r.prefix)) {
		r.prefix += "x"
	}
	var values, written []string
	type pair struct{ value, text string }
	var hidden []pair
	var b strings.Builder
	s := string(data)
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i:]
		text, value, set, ok := reference(s, lookupEnv)
		switch {
		case s[1] == '$':
			b.WriteByte('$')
			s = s[2:]
		case ok:
			ph := fmt.Sprintf("%s%dz", r.prefix, len(values)/2)
			b.WriteString(ph)
			values = append(values, ph, value)
			written = append(written, ph, text)
			if !set {
				r.unset[ph] = text[2 : len(text)-1]
			}
			if value != "" {
				hidden = append(hidden, pair{value, text})
			}
			s = s[len(text):]
		default:
			b.WriteByte('$')
			s = s[1:]
		}
	}
	slices.SortStableFunc(hidden, func(a, b pair) int { return cmp.Compare(len(b.value), len(a.value)) })
	var h []string
	for _, p := range hidden {
		h = append(h, p.value, p.text)
	}
	r.values, r.written, r.hidden = strings.NewReplacer(values...), strings.NewReplacer(written...), strings.NewReplacer(h...)
	return r, []byte(b.String())
}

// reference returns the ${...} reference s starts with, as written, and its
// value; set is false for a ${NAME} without default whose variable is
// unset, and ok is false when s starts with no well-formed reference.
func reference(s string, lookupEnv func(string) (string, bool)) (text, value string, set, ok bool) {
	if !strings.HasPrefix(s, "${") {
		return "", "", false, false
	}
	end := strings.IndexAny(s, "}\n")
	if end < 0 || s[end] != '}' {
		return "", "", false, false
	}
	name, def, hasDef := strings.Cut(s[2:end], ":-")
	if !envName.MatchString(name) {
		return "", "", false, false
	}
	value, set = lookupEnv(name)
	if value == "" && hasDef {
		value, set = def, true
	}
	return s[:end+1], value, set, true
}

// unsetIn returns the names of the unset variables that the scalar n uses
// without a default, in order of first use.
func (r *refs) unsetIn(n ast.Node) []string {
	var s string
	switch t := n.(type) {
	case *ast.StringNode:
		s = t.Value
	case *ast.LiteralNode:
		s = t.Value.Value
	}
	var names []string
	for i := strings.Index(s, r.prefix); i >= 0; {
		s = s[i:]
		end := strings.IndexByte(s, 'z')
		if name, ok := r.unset[s[:end+1]]; ok && !slices.Contains(names, name) {
			names = append(names, name)
		}
		s = s[end+1:]
		i = strings.Index(s, r.prefix)
	}
	return names
}

// expand returns s with its placeholders replaced by the variables' values,
// and whether it had any.
func (r *refs) expand(s string) (string, bool) {
	if !strings.Contains(s, r.prefix) {
		return s, false
	}
	return r.values.Replace(s), true
}

// asWritten returns s with its placeholders replaced by the references as
// written, for messages.
func (r *refs) asWritten(s string) string { return r.written.Replace(s) }

// hide returns s with every value of a variable replaced by the reference
// that produced it, for messages about values, which may be secrets.
func (r *refs) hide(s string) string { return r.hidden.Replace(s) }

// scalar returns n with the placeholders in its value replaced by the
// variables' values, or n itself when it has none. A quoted or block scalar
// stays a string; a plain one is typed by its value as YAML types a plain
// scalar (so max_conns: ${N} is an integer), and is null when the value is
// empty, so an unset variable leaves the key's default.
func (r *refs) scalar(n ast.Node) ast.Node {
	switch t := n.(type) {
	case *ast.StringNode:
		v, ok := r.expand(t.Value)
		if !ok {
			return n
		}
		if t.Token != nil && t.Token.Type == token.StringType {
			return plain(v, t)
		}
		c := *t
		c.Value = v
		return &c
	case *ast.LiteralNode:
		v, ok := r.expand(t.Value.Value)
		if !ok {
			return n
		}
		c, s := *t, *t.Value
		s.Value = v
		c.Value = &s
		return &c
	}
	return n
}

// plain types the value v of the plain scalar n.
func plain(v string, n *ast.StringNode) ast.Node {
	pos := n.Token.Position
	if v == "" {
		return ast.Null(token.New("null", "null", pos))
	}
	tk := token.New(v, v, pos)
	switch tk.Type {
	case token.IntegerType, token.BinaryIntegerType, token.OctetIntegerType, token.HexIntegerType:
		return ast.Integer(tk)
	case token.FloatType:
		return ast.Float(tk)
	case token.BoolType:
		return ast.Bool(tk)
	case token.InfinityType:
		return ast.Infinity(tk)
	case token.NanType:
		return ast.Nan(tk)
	}
	c := *n
	c.Value = v
	return &c
}

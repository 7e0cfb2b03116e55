package config

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// The decoder walks goccy's syntax tree itself rather than using
// yaml.Unmarshal, so that every error carries the dotted key path and line,
// and types are strict: no 1.5 for an integer, no 10 for a duration.

var durationType = reflect.TypeFor[Duration]()

// decode stores n into v, which must be settable; path is n's key path.
// A null value leaves v as it is.
func (l *loader) decode(n ast.Node, v reflect.Value, path string) {
	n = l.resolve(n, path)
	if _, null := n.(*ast.NullNode); n == nil || null {
		return
	}
	switch {
	case v.Type() == durationType:
		l.decodeDuration(n, v, path)
	case v.Kind() == reflect.Struct || v.Kind() == reflect.Map:
		l.decodeMapping(n, v, path)
	case v.Kind() == reflect.Slice:
		l.decodeList(n, v, path)
	case v.Kind() == reflect.Int:
		l.decodeInt(n, v, path)
	case v.Kind() == reflect.Bool:
		l.decodeBool(n, v, path)
	case v.Kind() == reflect.String:
		l.decodeString(n, v, path)
	}
}

// resolve looks through tags, anchors and aliases to the value node, with
// the variables in a scalar expanded. It returns nil after recording an
// error for an unknown alias.
func (l *loader) resolve(n ast.Node, path string) ast.Node {
	for {
		switch t := n.(type) {
		case *ast.TagNode:
			n = t.Value
		case *ast.AnchorNode:
			l.anchors[t.Name.GetToken().Value] = t.Value
			n = t.Value
		case *ast.AliasNode:
			name := t.Value.GetToken().Value
			if n = l.anchors[name]; n == nil {
				l.errorf(lineOf(t), path, "unknown alias *%s", name)
				return nil
			}
		default:
			for _, name := range l.env.unsetIn(n) {
				l.errorf(lineOf(n), path, "${%s} is not set (write ${%s:-} to allow an empty value)", name, name)
			}
			return l.env.scalar(n)
		}
	}
}

// decodeMapping decodes a mapping into a struct, by yaml tag, or into a map.
func (l *loader) decodeMapping(n ast.Node, v reflect.Value, path string) {
	m, ok := n.(ast.MapNode)
	if !ok {
		l.errorf(lineOf(n), path, "expected a mapping, got %s", kind(n))
		return
	}
	for it := m.MapRange(); it.Next(); {
		if it.Key().IsMergeKey() {
			l.decode(it.Value(), v, path)
			continue
		}
		name := it.Key().GetToken().Value
		if v.Kind() == reflect.Map {
			name, _ = l.env.expand(name)
		}
		key := join(path, name)
		l.lines[key] = lineOf(it.Key())
		if v.Kind() == reflect.Map {
			l.decodeEntry(it.Value(), v, name, key)
			continue
		}
		field, names := fieldByTag(v, name)
		if !field.IsValid() {
			l.errorf(lineOf(it.Key()), key, "unknown key (expected one of %s)", strings.Join(names, ", "))
			continue
		}
		l.decode(it.Value(), field, key)
	}
}

// decodeEntry decodes n into the entry name of the map v.
func (l *loader) decodeEntry(n ast.Node, v reflect.Value, name, key string) {
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	elem := reflect.New(v.Type().Elem()).Elem()
	l.decode(n, elem, key)
	v.SetMapIndex(reflect.ValueOf(name), elem)
}

// fieldByTag returns the field of the struct v whose yaml tag is name, or
// the zero Value and the tags that exist.
func fieldByTag(v reflect.Value, name string) (reflect.Value, []string) {
	var names []string
	for i := range v.NumField() {
		tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
		if tag == name {
			return v.Field(i), nil
		}
		names = append(names, tag)
	}
	return reflect.Value{}, names
}

// decodeList decodes a sequence into a slice; element keys are path[i].
func (l *loader) decodeList(n ast.Node, v reflect.Value, path string) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		l.errorf(lineOf(n), path, "expected a list, got %s", kind(n))
		return
	}
	list := reflect.MakeSlice(v.Type(), len(seq.Values), len(seq.Values))
	for i, elem := range seq.Values {
		key := fmt.Sprintf("%s[%d]", path, i)
		l.lines[key] = lineOf(elem)
		l.decode(elem, list.Index(i), key)
	}
	v.Set(list)
}

// decodeInt accepts only an integer that fits v.
func (l *loader) decodeInt(n ast.Node, v reflect.Value, path string) {
	x, ok := intValue(n)
	if !ok || v.OverflowInt(x) {
		l.errorf(lineOf(n), path, "expected an integer, got %s", describe(n))
		return
	}
	v.SetInt(x)
}

// intValue returns the value of an integer node that fits in an int64.
func intValue(n ast.Node) (int64, bool) {
	in, ok := n.(*ast.IntegerNode)
	if !ok {
		return 0, false
	}
	switch x := in.Value.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), x <= math.MaxInt64
	}
	return 0, false
}

// decodeBool accepts only true or false.
func (l *loader) decodeBool(n ast.Node, v reflect.Value, path string) {
	b, ok := n.(*ast.BoolNode)
	if !ok {
		l.errorf(lineOf(n), path, "expected true or false, got %s", describe(n))
		return
	}
	v.SetBool(b.Value)
}

// decodeString accepts any scalar, as written, so that "stream: 123" works.
func (l *loader) decodeString(n ast.Node, v reflect.Value, path string) {
	switch t := n.(type) {
	case *ast.StringNode:
		v.SetString(t.Value)
	case *ast.LiteralNode:
		v.SetString(t.Value.Value)
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		v.SetString(n.GetToken().Value)
	case ast.MapNode:
		l.errorf(lineOf(n), path, `expected a string, got a mapping (quote a value that starts with "{")`)
	default:
		l.errorf(lineOf(n), path, "expected a string, got %s", kind(n))
	}
}

// decodeDuration accepts only a string in Go duration syntax, not negative.
func (l *loader) decodeDuration(n ast.Node, v reflect.Value, path string) {
	s, ok := n.(*ast.StringNode)
	if !ok {
		l.errorf(lineOf(n), path, "invalid duration %s (use Go durations like 250ms or 10s)", describe(n))
		return
	}
	d, err := time.ParseDuration(s.Value)
	switch {
	case err != nil:
		l.errorf(lineOf(n), path, "invalid duration %s (use Go durations like 250ms or 10s)", describe(n))
	case d < 0:
		l.errorf(lineOf(n), path, "invalid duration %s (must not be negative)", describe(n))
	default:
		v.SetInt(int64(d))
	}
}

// kind names the YAML type of n, without its value.
func kind(n ast.Node) string {
	switch n.(type) {
	case ast.MapNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	case *ast.IntegerNode:
		return "an integer"
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "a boolean"
	}
	return fmt.Sprintf("a %s value", n.Type())
}

// describe shows a scalar's value and names other nodes' kind. It is used
// only for integer and duration keys, never for strings such as
// postgres.url.
func describe(n ast.Node) string {
	switch t := n.(type) {
	case *ast.StringNode:
		return strconv.Quote(t.Value)
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return n.GetToken().Value
	}
	return kind(n)
}

// join appends key to the dotted path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// lineOf returns the line of n, or 0 when it is unknown.
func lineOf(n ast.Node) int {
	if n == nil {
		return 0
	}
	return tokenLine(n.GetToken())
}

// tokenLine returns the line of tk, or 0 when it is unknown.
func tokenLine(tk *token.Token) int {
	if tk == nil || tk.Position == nil {
		return 0
	}
	return tk.Position.Line
}

package debezium

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// expand returns payload as the router's table.expand.json.payload
// publishes it through the JsonConverter, and false when the router keeps
// it a string. The router (Debezium 2.x, JsonSchemaData) expands a payload
// that starts with '{' or '[' and parses as JSON (the first value; what
// follows is ignored), infers a Kafka Connect schema from it and writes
// the document back by that schema. So, as in Debezium:
//   - object members whose value is null or an empty array are left out;
//   - the elements of an array must all have one JSON type (nulls
//     aside), and numbers one Java type (int, long or double), or the
//     payload stays a string, as it does with an integer too large for a
//     long and with a top-level array (not a struct);
//   - an array of objects has the members of all of them, each with the
//     schema of its first appearance, null in the elements that lack one.
//
// Numbers keep their text, where Jackson would print a double its own
// way (1e2 as 100.0): the same number to every JSON reader.
func expand(payload []byte) ([]byte, bool) {
	if len(payload) == 0 || payload[0] != '{' && payload[0] != '[' {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(payload))
	d.UseNumber()
	doc, err := parse(d)
	if err != nil {
		return nil, false
	}
	if doc.kind != kindObject {
		return nil, false
	}
	s, err := schemaOf(doc)
	if err != nil {
		return nil, false
	}
	b, err := write(nil, doc, s)
	if err != nil {
		return nil, false
	}
	return b, true
}

// The kinds of JSON nodes and of schemas.
const (
	kindNull = iota
	kindString
	kindBool
	kindInt    // a number that is a Java int
	kindLong   // a number that is a Java long and not an int
	kindDouble // a number with a fraction or an exponent
	kindBig    // an integer too large for a long, which the router cannot expand
	kindArray
	kindObject
)

// node is a parsed JSON value. Objects keep their members in order; a
// repeated member keeps its first place and its last value, as Jackson's
// ObjectNode does.
type node struct {
	kind  int
	text  string // a string's value, a number's text, a bool's true or false
	items []*node
	names []string
	vals  []*node
}

// parse reads one JSON value from d.
func parse(d *json.Decoder) (*node, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := t.(type) {
	case nil:
		return &node{kind: kindNull}, nil
	case bool:
		return &node{kind: kindBool, text: strconv.FormatBool(v)}, nil
	case string:
		return &node{kind: kindString, text: v}, nil
	case json.Number:
		return number(string(v)), nil
	case json.Delim:
		n := &node{kind: kindArray}
		if v == '{' {
			n.kind = kindObject
		}
		for d.More() {
			if n.kind == kindArray {
				item, err := parse(d)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, item)
				continue
			}
			if err := member(d, n); err != nil {
				return nil, err
			}
		}
		if _, err := d.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	}
	return nil, errors.New("unexpected token")
}

// member reads one member of object n from d.
func member(d *json.Decoder, n *node) error {
	t, err := d.Token()
	if err != nil {
		return err
	}
	name, _ := t.(string)
	v, err := parse(d)
	if err != nil {
		return err
	}
	for i, have := range n.names {
		if have == name {
			n.vals[i] = v
			return nil
		}
	}
	n.names, n.vals = append(n.names, name), append(n.vals, v)
	return nil
}

// number returns the node of a JSON number's text, typed as Jackson types
// it: int or long for an integer that fits, a big integer for one that
// does not, double otherwise.
func number(text string) *node {
	n := &node{kind: kindDouble, text: text}
	if strings.ContainsAny(text, ".eE") {
		return n
	}
	i, err := strconv.ParseInt(text, 10, 64)
	switch {
	case err != nil:
		n.kind = kindBig
	case i >= math.MinInt32 && i <= math.MaxInt32:
		n.kind, n.text = kindInt, strconv.FormatInt(i, 10)
	default:
		n.kind, n.text = kindLong, strconv.FormatInt(i, 10)
	}
	return n
}

// schema is the Kafka Connect schema the router infers for a node.
type schema struct {
	kind   int
	elem   *schema   // an array's
	names  []string  // an object's fields
	fields []*schema // their schemas
}

// errNoSchema fails an expansion the router would fail.
var errNoSchema = errors.New("no schema")

// schemaOf infers n's schema as the router does; nil for null, which
// leaves an object member out.
func schemaOf(n *node) (*schema, error) {
	switch n.kind {
	case kindNull:
		return nil, nil
	case kindBig:
		// Debezium gives it a double's schema and a BigDecimal value,
		// which the schema refuses.
		return nil, errNoSchema
	case kindArray:
		if len(n.items) == 0 {
			return nil, nil
		}
		elem, err := elemSchema(n.items)
		return &schema{kind: kindArray, elem: elem}, err
	case kindObject:
		s := &schema{kind: kindObject}
		for i, name := range n.names {
			f, err := schemaOf(n.vals[i])
			if err != nil {
				return nil, err
			}
			if f != nil {
				s.names, s.fields = append(s.names, name), append(s.fields, f)
			}
		}
		return s, nil
	}
	return &schema{kind: n.kind}, nil
}

// merge adds the fields of o that s lacks to s.
func (s *schema) merge(o *schema) {
	for i, name := range o.names {
		if s.field(name) == nil {
			s.names, s.fields = append(s.names, name), append(s.fields, o.fields[i])
		}
	}
}

// field returns the schema of s's field name, or nil.
func (s *schema) field(name string) *schema {
	for i, n := range s.names {
		if n == name {
			return s.fields[i]
		}
	}
	return nil
}

// elemSchema infers the element schema of a non-empty array: the first
// non-null element's, or, for objects, the merge of every object
// element's. Elements of another JSON type or Java number type fail, and
// so do all-null elements and a first element without a schema (an empty
// array).
func elemSchema(items []*node) (*schema, error) {
	var first *node
	for _, it := range items {
		switch {
		case it.kind == kindNull:
		case first == nil:
			first = it
		case it.kind != first.kind:
			return nil, errNoSchema
		}
	}
	if first == nil {
		return nil, errNoSchema
	}
	if first.kind != kindObject {
		s, err := schemaOf(first)
		if s == nil && err == nil {
			err = errNoSchema
		}
		return s, err
	}
	s := &schema{kind: kindObject}
	for _, it := range items {
		if it.kind != kindObject {
			continue
		}
		o, err := schemaOf(it)
		if err != nil {
			return nil, err
		}
		s.merge(o)
	}
	return s, nil
}

// write appends n written by schema s, failing where the Connect value
// would not match its schema (a number of another Java type).
func write(b []byte, n *node, s *schema) ([]byte, error) {
	if n.kind == kindNull {
		return append(b, "null"...), nil
	}
	switch {
	case s.kind != n.kind:
		return nil, errNoSchema
	case n.kind == kindObject:
		return writeObject(b, n, s)
	case n.kind == kindString:
		return quote(b, n.text), nil
	case n.kind == kindArray:
		b = append(b, '[')
		for i, it := range n.items {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = write(b, it, s.elem); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	}
	return append(b, n.text...), nil
}

// writeObject appends object n by object schema s: every field of s in
// order, null where n lacks it; members s lacks are left out.
func writeObject(b []byte, n *node, s *schema) ([]byte, error) {
	b = append(b, '{')
	for i, name := range s.names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(quote(b, name), ':')
		v := &node{kind: kindNull}
		for j, have := range n.names {
			if have == name {
				v = n.vals[j]
			}
		}
		var err error
		if b, err = write(b, v, s.fields[i]); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

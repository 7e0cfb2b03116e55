package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// Error is a problem with the configuration. Every error Load and Parse
// return is an *Error or joins several, so callers find one with errors.As.
type Error struct {
	// File is the config file's path; empty for Parse.
	File string
	// Line is the 1-based line of the problem; 0 when unknown, e.g. for a
	// required key that is missing.
	Line int
	// Key is the dotted key path, e.g. capture.poll.interval; empty when the
	// problem concerns the whole file.
	Key string
	// Msg says what is wrong.
	Msg string
	// Err is the underlying error, if any, such as a failed read.
	Err error
}

// Error formats e as "file:line: key: msg", leaving out the parts that are
// unknown. Without a file the line is written as "line 12: ".
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Load reads the configuration file at path and parses it like Parse, with
// the process environment. Errors name the file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		reason := err
		var pe *fs.PathError
		if errors.As(err, &pe) {
			reason = pe.Err
		}
		return nil, &Error{File: path, Msg: "cannot read the config file: " + reason.Error(), Err: err}
	}
	return parse(path, data, os.LookupEnv)
}

// Parse decodes the YAML data strictly, expanding ${VAR} and
// ${VAR:-default} inside scalar values with lookupEnv, applies the defaults
// and validates the result. It reports every problem it finds, each as an
// *Error; no message carries the value of a variable.
func Parse(data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	return parse("", data, lookupEnv)
}

// parse is Parse with the file name that errors carry.
func parse(file string, data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	env, data := newRefs(data, lookupEnv)
	l := &loader{file: file, env: env, lines: map[string]int{}, anchors: map[string]ast.Node{}}
	var c Config
	if l.decodeFile(data, &c) {
		setDefaults(&c)
		l.validateRest(&c)
	}
	switch len(l.errs) {
	case 0:
		return &c, nil
	case 1:
		return nil, l.errs[0]
	}
	return nil, errors.Join(l.errs...)
}

// loader decodes and validates one config file, collecting its errors.
type loader struct {
	file    string
	env     *refs
	lines   map[string]int // key path -> line of the key, for every key in the file
	anchors map[string]ast.Node
	errs    []error
}

// errorf records a problem with key on line. Variables' values in args are
// shown as the references that produced them, and placeholders as the
// references as written.
func (l *loader) errorf(line int, key, format string, args ...any) {
	for i, a := range args {
		switch v := a.(type) {
		case string:
			args[i] = l.env.hide(v)
		case error:
			args[i] = l.env.hide(v.Error())
		case fmt.Stringer:
			args[i] = l.env.hide(v.String())
		}
	}
	msg := l.env.asWritten(fmt.Sprintf(format, args...))
	key = l.env.hide(l.env.asWritten(key))
	l.errs = append(l.errs, &Error{File: l.file, Line: line, Key: key, Msg: msg})
}

// decodeFile parses data and decodes its single document into c. It
// reports whether the file had a document to decode: a syntax error or a
// second document leaves nothing worth validating.
func (l *loader) decodeFile(data []byte, c *Config) bool {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		l.syntaxError(data, err)
		return false
	}
	var bodies []ast.Node
	for _, doc := range f.Docs {
		if doc.Body != nil {
			bodies = append(bodies, doc.Body)
		}
	}
	switch {
	case len(bodies) > 1:
		l.errorf(lineOf(bodies[1]), "", "only one YAML document is allowed")
		return false
	case len(bodies) == 1:
		l.decode(bodies[0], reflect.ValueOf(c).Elem(), "")
	}
	return true
}

// validateRest validates c after decoding, so that one pass reports every
// problem: a key that failed to decode keeps its zero value or default, so
// validation errors about it, or about a key inside it, are left out.
func (l *loader) validateRest(c *Config) {
	decoded := len(l.errs)
	var failed []string
	for _, err := range l.errs {
		failed = append(failed, err.(*Error).Key)
	}
	l.validate(c)
	kept := l.errs[:decoded]
	for _, err := range l.errs[decoded:] {
		key := err.(*Error).Key
		if !slices.ContainsFunc(failed, func(f string) bool {
			return f == "" || key == f || strings.HasPrefix(key, f+".") || strings.HasPrefix(key, f+"[")
		}) {
			kept = append(kept, err)
		}
	}
	l.errs = kept
}

// syntaxError records a YAML syntax error. goccy's message is used without
// its source excerpt, which could show the postgres password.
func (l *loader) syntaxError(data []byte, err error) {
	line, msg := 0, "invalid YAML"
	var ye yaml.Error
	if errors.As(err, &ye) {
		line, msg = tokenLine(ye.GetToken()), "invalid YAML: "+ye.GetMessage()
	}
	l.errorf(line, keyAt(data, line), "%s", msg)
}

var keyLine = regexp.MustCompile(`^[\s-]*([A-Za-z0-9_.]+)\s*:(\s|$)`)

// keyAt guesses the key path of line from indentation, for syntax errors,
// where there is no syntax tree to walk.
func keyAt(data []byte, line int) string {
	type entry struct {
		indent int
		key    string
	}
	var stack []entry
	for i, text := range strings.SplitN(string(data), "\n", line+1) {
		m := keyLine.FindStringSubmatchIndex(text)
		if i >= line || m == nil {
			continue
		}
		indent := m[2]
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, entry{indent, text[m[2]:m[3]]})
	}
	keys := make([]string, len(stack))
	for i, e := range stack {
		keys[i] = e.key
	}
	return strings.Join(keys, ".")
}

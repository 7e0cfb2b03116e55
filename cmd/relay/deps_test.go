package main

import (
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoTestCodeInBinary checks that the service binary links neither
// package testing nor internal/testenv (the demo's servers come from
// internal/embedded).
func TestNoTestCodeInBinary(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasSuffix(pkg, "/internal/testenv") {
			t.Errorf("cmd/relay depends on %s", pkg)
		}
	}
}

// TestImportsOneWay checks the layering between config, sink, capture and
// internal/schema: settings flow down from config through internal/app, so
// no sink package (or its tests) imports config, no capture package imports
// a sink package, the capture modes capture/poll and capture/wal do not
// import each other (what both need lives in capture/internal), internal/schema
// imports neither config nor sink, the leaf capture/table (the public table
// layout, which internal/schema builds on) imports nothing else of the
// module, and the leaves fault and sink/template import nothing else of
// the module but event.
func TestImportsOneWay(t *testing.T) {
	t.Parallel()
	const mod = "github.com/outboxrelay/relay/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		for _, imp := range fields[1:] {
			dep, ok := strings.CutPrefix(imp, mod)
			if !ok || dep == pkg {
				continue
			}
			var broken bool
			switch {
			case under(pkg, "sink"):
				broken = under(dep, "config") || pkg == "sink/template" && dep != "event"
			case pkg == "capture/table":
				broken = true
			case under(pkg, "capture"):
				broken = under(dep, "sink") || otherMode(pkg, dep)
			case pkg == "internal/schema":
				broken = under(dep, "config") || under(dep, "sink")
			case pkg == "fault":
				broken = true
			}
			if broken {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}

// otherMode reports whether pkg is (a package under) one capture mode and
// dep (a package under) the other.
func otherMode(pkg, dep string) bool {
	return under(pkg, "capture/poll") && under(dep, "capture/wal") || under(pkg, "capture/wal") && under(dep, "capture/poll")
}

// under reports whether pkg is root or a package below it.
func under(pkg, root string) bool { return pkg == root || strings.HasPrefix(pkg, root+"/") }

// TestPublicAPITakesNoInternalTypes checks that no exported function,
// method, variable or exported struct field of the module's public packages
// names a type of an internal package: a program outside the module could
// not call or fill it (capture/wal's Setup took internal/schema.Layout).
// Type aliases count as what they stand for, so an alias of a public type
// in an internal package is fine.
func TestPublicAPITakesNoInternalTypes(t *testing.T) {
	t.Parallel()
	const mod = "github.com/outboxrelay/relay"
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", mod+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, out)
	}
	exports := map[string]string{}
	var public []string
	for line := range strings.Lines(string(out)) {
		path, file, _ := strings.Cut(strings.TrimSpace(line), " ")
		exports[path] = file
		if file != "" && strings.HasPrefix(path, mod+"/") && !strings.Contains(path, "/internal/") && !strings.HasPrefix(path, mod+"/cmd/") {
			public = append(public, path)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	for _, path := range public {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		for _, name := range pkg.Scope().Names() {
			obj := pkg.Scope().Lookup(name)
			if !obj.Exported() {
				continue
			}
			for _, bad := range internalTypes(obj, mod) {
				t.Errorf("%s.%s names %s, a type of an internal package", path, name, bad)
			}
		}
	}
}

// internalTypes returns the types of internal packages of mod that obj's
// exported surface names: a function's signature, a variable's type, and
// for a type name its exported fields and methods.
func internalTypes(obj types.Object, mod string) []string {
	var found []string
	seen := map[types.Type]bool{}
	var walk func(types.Type)
	walk = func(typ types.Type) {
		if seen[typ] {
			return
		}
		seen[typ] = true
		switch x := typ.(type) {
		case *types.Named:
			if p := x.Obj().Pkg(); p != nil && strings.HasPrefix(p.Path(), mod+"/") && strings.Contains(p.Path(), "/internal/") {
				found = append(found, p.Path()+"."+x.Obj().Name())
			}
			for i := range x.TypeArgs().Len() {
				walk(x.TypeArgs().At(i))
			}
		case *types.Pointer:
			walk(x.Elem())
		case *types.Slice:
			walk(x.Elem())
		case *types.Array:
			walk(x.Elem())
		case *types.Map:
			walk(x.Key())
			walk(x.Elem())
		case *types.Chan:
			walk(x.Elem())
		case *types.Signature:
			for i := range x.Params().Len() {
				walk(x.Params().At(i).Type())
			}
			for i := range x.Results().Len() {
				walk(x.Results().At(i).Type())
			}
		case *types.Struct:
			for i := range x.NumFields() {
				if f := x.Field(i); f.Exported() {
					walk(f.Type())
				}
			}
		case *types.Interface:
			for i := range x.NumMethods() {
				walk(x.Method(i).Type())
			}
		}
	}
	switch o := obj.(type) {
	case *types.TypeName:
		walk(o.Type().Underlying())
		if named, ok := o.Type().(*types.Named); ok {
			for i := range named.NumMethods() {
				if m := named.Method(i); m.Exported() {
					walk(m.Type())
				}
			}
		}
	default:
		walk(obj.Type())
	}
	return found
}

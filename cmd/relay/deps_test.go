package main

import (
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

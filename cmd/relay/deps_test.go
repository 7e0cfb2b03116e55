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

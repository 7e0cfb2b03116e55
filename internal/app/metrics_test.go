package app

import (
	"runtime"
	"testing"
)

// TestBuildInfoMetric checks that every registry has relay_build_info = 1
// with the version, commit and Go version labels.
func TestBuildInfoMetric(t *testing.T) {
	families, err := newRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "relay_build_info" {
			continue
		}
		m := f.GetMetric()
		if len(m) != 1 || m[0].GetGauge().GetValue() != 1 {
			t.Fatalf("relay_build_info: %v, want one gauge = 1", m)
		}
		labels := map[string]string{}
		for _, l := range m[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] == "" || labels["commit"] == "" || labels["go_version"] != runtime.Version() {
			t.Errorf("relay_build_info labels %v, want version, commit and go_version=%s", labels, runtime.Version())
		}
		return
	}
	t.Fatal("no relay_build_info in the registry")
}

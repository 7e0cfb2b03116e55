package app

import (
	"math"
	"runtime"
	"testing"

	"github.com/outboxrelay/relay/capture/wal"
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

// TestSafeWALFraction checks relay_replication_slot_safe_wal_fraction:
// safe_wal_size over max_slot_wal_keep_size, 0 past the limit (a negative
// safe_wal_size), NaN when unlimited, lost or missing.
func TestSafeWALFraction(t *testing.T) {
	for _, c := range []struct {
		st   wal.SlotState
		want float64
	}{
		{wal.SlotState{Exists: true, WALStatus: "reserved", SafeWALSize: 750, KeepSize: 1000}, 0.75},
		{wal.SlotState{Exists: true, WALStatus: "unreserved", SafeWALSize: -10, KeepSize: 1000}, 0},
		{wal.SlotState{Exists: true, WALStatus: "reserved", SafeWALSize: -1, KeepSize: -1}, math.NaN()},
		{wal.SlotState{Exists: true, WALStatus: "lost", SafeWALSize: -1, KeepSize: 1000}, math.NaN()},
		{wal.SlotState{WALStatus: "missing", SafeWALSize: -1, KeepSize: 1000}, math.NaN()},
	} {
		got := safeFraction(c.st)
		if got != c.want && !(math.IsNaN(got) && math.IsNaN(c.want)) {
			t.Errorf("%+v: %v, want %v", c.st, got, c.want)
		}
	}
}

package claim

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/outboxtest"
)

// TestClaimOfPartitions: the claim without the partition filter serves
// only a relay that leases every partition; with any partition missing
// (also when a partition is listed twice or one is out of range) the claim
// filters rows by partition, so relays sharing an outbox never claim each
// other's rows.
func TestClaimOfPartitions(t *testing.T) {
	q := buildQueries(outboxtest.Layout(), "delete", false, nil, 8<<20)
	all := []int32{3, 1, 0, 2}
	for _, tc := range []struct {
		parts    []int32
		filtered bool
	}{
		{all, false},
		{[]int32{0, 1, 2}, true},
		{[]int32{0, 1, 2, 2}, true},
		{[]int32{0, 1, 2, 4}, true},
		{[]int32{0, 1, 2, 3, 3}, false},
		{nil, true},
	} {
		claim, skipped, args := q.claimOf(tc.parts, 4, 10, 20, 500, []int64{}, []string{})
		for _, sql := range []string{claim, skipped} {
			if got := strings.Contains(sql, "hashtext"); got != tc.filtered {
				t.Errorf("parts %v of 4: filtered %v, want %v", tc.parts, got, tc.filtered)
			}
			if !strings.Contains(sql, "relay.safe") {
				t.Errorf("parts %v: the claim is not bounded by the safe seq: %s", tc.parts, sql)
			}
			if n := strings.Count(sql, "$"); n != len(args) {
				t.Errorf("parts %v: %d parameters, %d arguments", tc.parts, n, len(args))
			}
		}
	}
}

// TestArchiveOfDensity: seqs that fill at least a quarter of their range
// are archived with the range statement, sparser ones key by key.
func TestArchiveOfDensity(t *testing.T) {
	q := queries{archive: "keys", archiveRange: "range"}
	for _, tc := range []struct {
		seqs []int64
		want string
	}{
		{[]int64{7}, "range"},
		{[]int64{5, 6, 7, 9}, "range"},
		{[]int64{13, 10, 22, 12}, "range"},
		{[]int64{40, 10, 20, 30}, "keys"},
		{[]int64{1, 100}, "keys"},
		{[]int64{9, 1, 5}, "range"},
		{[]int64{1, 2, 3, 1000}, "keys"},
	} {
		sql, args := q.archiveOf(tc.seqs)
		if sql != tc.want {
			t.Errorf("%v: %s, want %s", tc.seqs, sql, tc.want)
		}
		if sql == "range" && (args[1] != slices.Min(tc.seqs) || args[2] != slices.Max(tc.seqs)) {
			t.Errorf("%v: range %v..%v", tc.seqs, args[1], args[2])
		}
	}
}

package claim

import (
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

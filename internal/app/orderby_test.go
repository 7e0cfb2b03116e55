package app

import "testing"

// TestLayoutOrderBy maps outbox.order_by: unset, aggregate_id and the
// remapped aggregate id column all mean the aggregate id (no order
// column); another name is the order column as given.
func TestLayoutOrderBy(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"", ""},
		{"outbox:\n  order_by: aggregate_id\n", ""},
		{"outbox:\n  columns: {aggregate_id: order_id}\n  order_by: aggregate_id\n", ""},
		{"outbox:\n  columns: {aggregate_id: order_id}\n  order_by: order_id\n", ""},
		{"outbox:\n  order_by: tenant_id\n", "tenant_id"},
		{"outbox:\n  columns: {aggregate_id: order_id}\n  order_by: Tenant Id\n", "Tenant Id"},
	} {
		if got := layoutOf(parse(t, minimalYAML+tc.yaml)).Cols.OrderBy; got != tc.want {
			t.Errorf("%q: order column %q, want %q", tc.yaml, got, tc.want)
		}
	}
}

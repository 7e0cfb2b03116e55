package config

// Column returns the outbox table's name for the contract column name: the
// outbox.columns mapping for it, or name itself.
func (o Outbox) Column(name string) string {
	if c := o.Columns[name]; c != "" {
		return c
	}
	return name
}

// OrderColumn returns the column outbox.order_by names: the aggregate_id
// column (after remapping) for aggregate_id, the default, and the name as
// given otherwise.
func (o Outbox) OrderColumn() string {
	if o.OrderBy == "" || o.OrderBy == "aggregate_id" {
		return o.Column("aggregate_id")
	}
	return o.OrderBy
}

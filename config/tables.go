package config

// Column returns the outbox table's name for the contract column name: the
// outbox.columns mapping for it, or name itself.
func (o Outbox) Column(name string) string {
	if c := o.Columns[name]; c != "" {
		return c
	}
	return name
}

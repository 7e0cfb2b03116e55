package debezium

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ParsePlacements parses placements written as the router's
// table.fields.additional.placement value: items column:placement or
// column:placement:alias, separated by commas, in any of specs (so both
// one string and a list of them work). The placement is header or
// envelope; Debezium's partition placement is refused. columns maps the
// outbox table's column names to the fields they hold; a column it lacks
// is refused, naming those it has.
func ParsePlacements(specs []string, columns map[string]Field) ([]Placement, error) {
	var out []Placement
	for _, spec := range specs {
		for _, item := range strings.Split(spec, ",") {
			p, err := parsePlacement(strings.TrimSpace(item), columns)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
	}
	return out, nil
}

func parsePlacement(item string, columns map[string]Field) (Placement, error) {
	parts := strings.Split(item, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
		return Placement{}, fmt.Errorf("%q is not column:placement or column:placement:alias", item)
	}
	f, ok := columns[parts[0]]
	if !ok {
		return Placement{}, fmt.Errorf("%q: column %q is not one the relay reads and can place (%s)",
			item, parts[0], strings.Join(slices.Sorted(maps.Keys(columns)), ", "))
	}
	p := Placement{Field: f, Name: parts[0]}
	if len(parts) == 3 {
		if p.Name = parts[2]; p.Name == "" {
			return Placement{}, fmt.Errorf("%q: the alias is empty", item)
		}
	}
	switch parts[1] {
	case "header":
	case "envelope":
		p.Envelope = true
	case "partition":
		return Placement{}, fmt.Errorf("%q: the partition placement is not supported; the key (the aggregate id, or outbox.order_by) picks the partition", item)
	default:
		return Placement{}, fmt.Errorf("%q: the placement must be header or envelope, got %q", item, parts[1])
	}
	return p, nil
}

package table_test

import (
	"fmt"

	"github.com/outboxrelay/relay/capture/table"
)

// A program that relays an outbox with its own table and column names
// builds the layout from the documented one.
func ExampleLayout() {
	l := table.DefaultLayout()
	l.Outbox = table.ParseName("billing.events")
	l.Cols.ID, l.Cols.Payload = "event_id", "body"
	l.DeadLetter = table.ParseName("billing.events_dead_letter")
	fmt.Println(l.Outbox, l.DeadLetter)
	fmt.Println(l.Cols.Quoted(""))
	// Output:
	// billing.events billing.events_dead_letter
	// "event_id", "aggregate_type", "aggregate_id", "event_type", "body", "headers", "created_at", "seq"
}

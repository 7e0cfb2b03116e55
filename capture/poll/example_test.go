package poll_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/poll"
	"github.com/outboxrelay/relay/capture/table"
)

// A program outside this module captures the outbox's rows with the
// public packages alone: the layout from capture/table, the source from
// capture/poll. It publishes each batch's events and then archives them.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	src, err := poll.New(ctx, poll.Options{Pool: pool, Layout: table.DefaultLayout()})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	for {
		b, err := src.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		// Publish b.Events() in order here; then archive them.
		if err := b.Complete(ctx, capture.Outcome{Published: b.Events()}); err != nil {
			log.Fatal(err)
		}
	}
}

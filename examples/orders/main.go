// Command orders is the example service of the relay's helpers: an orders
// API whose POST /orders is idempotent with the Idempotency-Key header and
// writes each order and its order.created event in one transaction, and a
// consumer that applies every order.created event it reads from NATS
// JetStream exactly once. See README.md.
//
//	go run ./examples/orders -listen 127.0.0.1:8080 -database postgres://...
//	go run ./examples/orders -consume nats://127.0.0.1:4222 -database postgres://...
//
// Both modes create the tables they use when missing; given -listen and
// -consume, one process runs both. SIGINT or SIGTERM stops it (exit 0).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/relay/helpers/idempotency"
	"github.com/outboxrelay/relay/helpers/inbox"
	"github.com/outboxrelay/relay/helpers/outbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// options are the command line.
type options struct {
	listen, database, consume, stream, subject string
	tokens                                     map[string]string // API token -> caller name
}

// run runs the command with args until ctx ends and returns the exit
// status: 0 after a signal, 1 on a runtime failure, 2 on bad usage.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "orders:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if err := serve(ctx, o, log); err != nil {
		log.Error("orders stopped", "err", err)
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "", "serve the orders API on this host:port")
	fs.StringVar(&o.database, "database", "", "PostgreSQL URL (required)")
	fs.StringVar(&o.consume, "consume", "", "consume order.created events from this NATS URL")
	fs.StringVar(&o.stream, "stream", "OUTBOX", "JetStream stream the relay publishes to")
	fs.StringVar(&o.subject, "subject", "outbox.order", "subject of the order events")
	tokens := fs.String("tokens", os.Getenv("ORDERS_TOKENS"), "API callers as name=token,... (default $ORDERS_TOKENS); an Idempotency-Key is honoured only with a caller's token")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.tokens, err = parseTokens(*tokens); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.database == "":
		return o, errors.New("-database is required")
	case o.listen == "" && o.consume == "":
		return o, errors.New("give -listen, -consume or both")
	}
	return o, nil
}

// serve creates the tables and runs the API and the consumer that o asks
// for until ctx ends.
func serve(ctx context.Context, o options, log *slog.Logger) error {
	pool, err := pgxpool.New(ctx, o.database)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	store, err := idempotency.NewStore(pool, "")
	if err != nil {
		return err
	}
	if err := createTables(ctx, pool, store); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	if o.listen != "" {
		if len(o.tokens) == 0 {
			log.Warn("no -tokens: requests without an Idempotency-Key work, keyed ones are answered 401")
		}
		g.Go(func() error { return listen(ctx, o.listen, newAPI(store, o.tokens), log) })
		g.Go(func() error { return purgeKeys(ctx, store, log) })
	}
	if o.consume != "" {
		g.Go(func() error { return consume(ctx, pool, o, log) })
	}
	return g.Wait()
}

// schema is the example's own tables: the orders, and what the consumer
// keeps per customer.
const schema = `CREATE TABLE IF NOT EXISTS public.orders (
  id         uuid        PRIMARY KEY,
  customer   text        NOT NULL,
  amount     numeric     NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS public.customer_stats (
  customer text    PRIMARY KEY,
  orders   int     NOT NULL,
  amount   numeric NOT NULL
)`

// createTables creates every table of the example when missing: orders,
// outbox, idempotency keys, the consumer's processed messages and stats.
func createTables(ctx context.Context, pool *pgxpool.Pool, store *idempotency.Store) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}
	if err := outbox.CreateTable(ctx, pool); err != nil {
		return err
	}
	if err := store.CreateTable(ctx); err != nil {
		return err
	}
	return inbox.CreateTable(ctx, pool)
}

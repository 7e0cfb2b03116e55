package demo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/app"
	"github.com/outboxrelay/relay/internal/embedded"
)

// Names of what the demo creates.
const (
	database = "demo"
	stream   = "DEMO"
	subject  = "demo.orders.{aggregate_type}"
)

// env holds everything the demo started, with the functions that stop it.
type env struct {
	opts    Options
	pg      *embedded.Postgres
	dsn     string
	nats    *embedded.NATS
	cfg     *config.Config
	cons    *consumer
	rel     *relay
	prod    *producer
	pool    *pgxpool.Pool
	closers []func()
}

// close stops everything started so far, the last started first.
func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startServers starts the PostgreSQL cluster, creates the demo database and
// starts the NATS server.
func (e *env) startServers(ctx context.Context) error {
	begin := time.Now()
	pg, err := embedded.StartPostgres(ctx, embedded.PostgresOptions{})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	e.pg = pg
	e.closers = append(e.closers, e.stopPostgres)
	if e.dsn, err = pg.CreateDatabase(ctx, database); err != nil {
		return err
	}
	if e.nats, err = embedded.StartNATS(embedded.NATSOptions{}); err != nil {
		return fmt.Errorf("start NATS: %w", err)
	}
	e.closers = append(e.closers, e.nats.Shutdown)
	fmt.Fprintf(e.opts.Out, "demo: PostgreSQL on port %d and NATS JetStream at %s ready in %.1fs\n",
		pg.Port(), e.nats.URL(), time.Since(begin).Seconds())
	return nil
}

// stopPostgres stops the cluster and removes its directory, reporting a
// failure to do so.
func (e *env) stopPostgres() {
	if err := e.pg.Stop(); err != nil {
		fmt.Fprintf(e.opts.Out, "demo: stopping PostgreSQL (%s): %v\n", e.pg.Dir(), err)
	}
}

// startClients creates the schema and stream, then starts the consumer,
// the relay (logging to logs at level warn) and the producers' pool.
func (e *env) startClients(ctx context.Context, logs io.Writer) error {
	var err error
	if e.cfg, err = relayConfig(e.dsn, e.nats.URL()); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := createSchema(ctx, e.cfg, log); err != nil {
		return err
	}
	if e.cons, err = startConsumer(ctx, e.nats.URL()); err != nil {
		return err
	}
	e.closers = append(e.closers, e.cons.stop)
	if e.rel, err = startRelay(ctx, e.cfg, log); err != nil {
		return err
	}
	e.closers = append(e.closers, func() { e.rel.stop() })
	if e.pool, err = connect(ctx, e.dsn, e.opts.Producers); err != nil {
		return err
	}
	e.closers = append(e.closers, e.pool.Close)
	return nil
}

// relayConfig returns the relay's config: poll capture every 50ms at most,
// the NATS sink on stream DEMO.
func relayConfig(dsn, natsURL string) (*config.Config, error) {
	yaml := fmt.Sprintf(`postgres:
  url: %q
capture:
  mode: poll
  poll:
    interval: 50ms
sink:
  type: nats
  nats:
    url: %q
    subject: %q
    stream: %s
log:
  level: warn
shutdown_timeout: 5s
`, dsn, natsURL, subject, stream)
	cfg, err := config.Parse([]byte(yaml), os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("demo config: %w", err)
	}
	return cfg, nil
}

// createSchema runs `relay init` for cfg and creates the business table the
// producers update in the same transactions as they write the outbox.
func createSchema(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if err := app.Init(ctx, cfg, app.InitOptions{}, io.Discard, log); err != nil {
		return fmt.Errorf("relay init: %w", err)
	}
	pool, err := connect(ctx, cfg.Postgres.URL, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, createOrders); err != nil {
		return fmt.Errorf("create table orders: %w", err)
	}
	return nil
}

// connect opens a pool of at most conns connections to dsn.
func connect(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return pool, nil
}

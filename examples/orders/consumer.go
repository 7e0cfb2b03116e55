package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/helpers/inbox"
)

// consumerName names the consumer, both its JetStream durable consumer and
// its records in the inbox table.
const consumerName = "customer-stats"

// stats is the consumer's inbox: it records which events it applied.
var stats = inbox.ForConsumer(consumerName)

// consume reads the order events of o.stream from the NATS server o.consume
// and applies each one exactly once, until ctx ends.
func consume(ctx context.Context, pool *pgxpool.Pool, o options, log *slog.Logger) error {
	nc, err := nats.Connect(o.consume, nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := durable(ctx, js, o, log)
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) { handle(ctx, pool, msg, log) })
	if err != nil {
		return err
	}
	defer cc.Stop()
	log.Info("consuming order events", "stream", o.stream, "subject", o.subject)
	<-ctx.Done()
	return nil
}

// durable returns the consumer's durable JetStream consumer, waiting for the
// relay to create the stream.
func durable(ctx context.Context, js jetstream.JetStream, o options, log *slog.Logger) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{Durable: consumerName, FilterSubject: o.subject,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}
	for {
		cons, err := js.CreateOrUpdateConsumer(ctx, o.stream, cfg)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return cons, err
		}
		log.Info("waiting for the relay to create the stream", "stream", o.stream)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// handle applies one event: it adds the order to its customer's stats,
// unless the inbox says this consumer applied the event's message_id
// already, and acknowledges the message once that committed.
func handle(ctx context.Context, pool *pgxpool.Pool, msg jetstream.Msg, log *slog.Logger) {
	id := msg.Headers().Get("message_id")
	var o order
	if err := json.Unmarshal(msg.Data(), &o); err != nil || id == "" {
		log.Error("malformed event, dropped", "message_id", id, "err", err)
		_ = msg.Term()
		return
	}
	applied, err := stats.Handle(ctx, pool, id, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO public.customer_stats (customer, orders, amount) VALUES ($1, 1, $2)
			ON CONFLICT (customer) DO UPDATE SET orders = customer_stats.orders + 1,
			amount = customer_stats.amount + excluded.amount`, o.Customer, string(o.Amount))
		return err
	})
	if err != nil {
		log.Error("applying the event failed; it will be redelivered", "message_id", id, "err", err)
		_ = msg.Nak()
		return
	}
	log.Info("order event", "message_id", id, "order", o.ID, "applied", applied)
	_ = msg.Ack()
}

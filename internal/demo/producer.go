package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

// SQL of the producers. Each outbox row is written in the same transaction
// as the business write it announces.
const (
	createOrders = `CREATE TABLE IF NOT EXISTS orders (
  id         text PRIMARY KEY,
  status     text NOT NULL,
  step       int NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
)`
	upsertOrder = `INSERT INTO orders (id, status, step) VALUES ($1, $2, $3)
  ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, step = EXCLUDED.step, updated_at = now()`
	insertEvent = `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
  VALUES ($1, 'order', $2, $3, $4, '{"source": "relay-demo"}')`
)

// maxEventsPerTx is the most events one transaction writes.
const maxEventsPerTx = 5

// statuses are the event types an order goes through, over and over.
var statuses = []string{"created", "item_added", "paid", "packed", "shipped", "delivered"}

// producer writes the demo's events from concurrent transactions.
type producer struct {
	opts    Options
	written atomic.Int64  // events in committed transactions
	done    chan struct{} // closed when run returned
	err     error         // run's result, set before done is closed
	ids     []string      // ids of the committed events, set before done is closed
}

// newProducer returns a producer of the events opts asks for.
func newProducer(opts Options) *producer {
	return &producer{opts: opts, done: make(chan struct{})}
}

// run writes all events with opts.Producers concurrent workers and closes
// p.done. It stops at the first failed transaction.
func (p *producer) run(ctx context.Context, pool *pgxpool.Pool) {
	defer close(p.done)
	g, ctx := errgroup.WithContext(ctx)
	ids := make([][]string, p.opts.Producers)
	for w := range p.opts.Producers {
		g.Go(func() (err error) {
			ids[w], err = p.worker(ctx, pool, p.owned(w))
			return err
		})
	}
	p.err = g.Wait()
	p.ids = slices.Concat(ids...)
}

// order is one aggregate a worker writes events for.
type order struct {
	id    string
	next  int // step of the next event, from 1
	total int // how many events it gets
}

// owned returns the orders worker w owns, with their share of the events.
func (p *producer) owned(w int) []*order {
	n, events := p.opts.Aggregates, p.opts.Events
	var orders []*order
	for k := w; k < n; k += p.opts.Producers {
		total := events / n
		if k < events%n {
			total++
		}
		if total > 0 {
			orders = append(orders, &order{id: fmt.Sprintf("order-%d", k), next: 1, total: total})
		}
	}
	return orders
}

// row is one outbox event.
type row struct {
	id, order, status, payload string
	step                       int
}

// worker writes every event of orders, in transactions of 1 to
// maxEventsPerTx events of randomly chosen orders, each order's events in
// step order. It returns the ids of the committed events.
func (p *producer) worker(ctx context.Context, pool *pgxpool.Pool, orders []*order) ([]string, error) {
	var ids []string
	for len(orders) > 0 {
		var rows []row
		for n := 1 + rand.IntN(maxEventsPerTx); n > 0 && len(orders) > 0; n-- {
			i := rand.IntN(len(orders))
			rows = append(rows, orders[i].nextRow())
			if orders[i].next > orders[i].total {
				orders = slices.Delete(orders, i, i+1)
			}
		}
		if err := writeTx(ctx, pool, rows); err != nil {
			return ids, err
		}
		for _, r := range rows {
			ids = append(ids, r.id)
		}
		p.written.Add(int64(len(rows)))
	}
	return ids, nil
}

// nextRow returns the order's next event.
func (o *order) nextRow() row {
	step := o.next
	o.next++
	status := statuses[(step-1)%len(statuses)]
	return row{
		id: uuid.NewString(), order: o.id, status: status, step: step,
		payload: fmt.Sprintf(`{"order": %q, "step": %d, "status": %q}`, o.id, step, status),
	}
}

// writeTx updates the orders and writes their events in one transaction.
func writeTx(ctx context.Context, pool *pgxpool.Pool, rows []row) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, r := range rows {
			b.Queue(upsertOrder, r.order, r.status, r.step)
			b.Queue(insertEvent, r.id, r.order, "order."+r.status, r.payload)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

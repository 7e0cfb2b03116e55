package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/helpers/idempotency"
	"github.com/outboxrelay/relay/helpers/outbox"
)

// order is the body of POST /orders and the payload of order.created.
type order struct {
	ID       string      `json:"id,omitempty"`
	Customer string      `json:"customer"`
	Amount   json.Number `json:"amount"`
}

// newAPI returns the orders API: POST /orders, idempotent with the
// Idempotency-Key header. The header X-Client-Id stands for the caller's
// authenticated identity, the scope of its keys.
func newAPI(store *idempotency.Store) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotency.Middleware(store, idempotency.Options{
		Caller: func(r *http.Request) string { return r.Header.Get("X-Client-Id") },
	})(http.HandlerFunc(createOrder)))
	return mux
}

// createOrder writes the order and its order.created event in the request's
// transaction and answers 201 with the order's id.
func createOrder(w http.ResponseWriter, r *http.Request) {
	var o order
	dec := json.NewDecoder(r.Body)
	dec.UseNumber()
	if err := dec.Decode(&o); err != nil || o.Customer == "" || o.Amount == "" {
		http.Error(w, `want a JSON body {"customer": "...", "amount": N}`, http.StatusBadRequest)
		return
	}
	id, err := uuid.NewV7()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	o.ID = id.String()
	ctx := r.Context()
	tx := idempotency.Tx(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO public.orders (id, customer, amount) VALUES ($1, $2, $3)`,
		o.ID, o.Customer, string(o.Amount)); err != nil {
		http.Error(w, "saving the order failed", http.StatusInternalServerError)
		return
	}
	if _, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: o.ID,
		EventType: "order.created", Payload: o}); err != nil {
		http.Error(w, "saving the order failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+o.ID)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "{\"id\": %q}\n", o.ID)
}

// listen serves h on addr until ctx ends, then shuts down gracefully.
func listen(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stopped := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- srv.Shutdown(sctx)
	}()
	log.Info("serving the orders API", "addr", l.Addr().String())
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-stopped
}

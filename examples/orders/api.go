package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
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
// Idempotency-Key header for authenticated callers. tokens maps each API
// token to its caller's name; a request's caller is the name of the token
// it sends as "Authorization: Bearer TOKEN", the scope of its keys. A
// request without a key needs no token; a key without a valid token is
// answered 401, so no client can replay another's response.
func newAPI(store *idempotency.Store, tokens map[string]string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotency.Middleware(store, idempotency.Options{
		Caller: func(r *http.Request) string { return callerOf(r, tokens) },
	})(http.HandlerFunc(createOrder)))
	return mux
}

// callerOf returns the name of the caller whose token r carries as
// "Authorization: Bearer TOKEN", or "" when it carries none of tokens.
// Every token is compared in constant time.
func callerOf(r *http.Request, tokens map[string]string) string {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" {
		return ""
	}
	caller := ""
	for token, name := range tokens {
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			caller = name
		}
	}
	return caller
}

// parseTokens reads "name=token,name=token" (the -tokens flag or
// ORDERS_TOKENS) into a map from token to name.
func parseTokens(s string) (map[string]string, error) {
	tokens := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		name, token, ok := strings.Cut(pair, "=")
		if !ok || name == "" || len(token) < 16 {
			return nil, errors.New(`-tokens: want name=token pairs, each token at least 16 characters`)
		}
		tokens[token] = name
	}
	return tokens, nil
}

// purgeInterval is how often the example deletes expired idempotency keys.
const purgeInterval = 10 * time.Minute

// purgeKeys deletes expired idempotency keys now and every purgeInterval
// until ctx ends; a failure is logged and retried at the next tick.
func purgeKeys(ctx context.Context, store *idempotency.Store, log *slog.Logger) error {
	t := time.NewTicker(purgeInterval)
	defer t.Stop()
	for {
		if n, err := store.Purge(ctx); err != nil && ctx.Err() == nil {
			log.Warn("purging expired idempotency keys failed", "err", err)
		} else if n > 0 {
			log.Info("purged expired idempotency keys", "keys", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
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

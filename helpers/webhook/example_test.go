package webhook_test

import (
	"io"
	"log"
	"net/http"
	"os"

	"github.com/outboxrelay/relay/helpers/webhook"
)

// A receiver verifies each request before it acts on it, then deduplicates
// on the webhook-id, the signed message id.
func Example() {
	v, err := webhook.NewVerifier(os.Getenv("WEBHOOK_SECRET")) // whsec_… or raw, the relay's sink.webhook.secret
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("/outbox/order", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		if err := v.Verify(r.Header, body); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized) // 401: the relay holds the events and retries; nothing is lost to a wrong secret
			return
		}
		log.Printf("event %s", r.Header.Get(webhook.HeaderID)) // the message id: skip it if already handled
		w.WriteHeader(http.StatusNoContent)
	})
}

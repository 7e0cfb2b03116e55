// Package idempotency makes HTTP handlers idempotent with the
// Idempotency-Key request header, storing each key's response in PostgreSQL
// in the same transaction as the handler's writes and its outbox events:
// a response is stored if and only if the handler's transaction committed.
//
//	store, err := idempotency.NewStore(pool, "")
//	err = store.CreateTable(ctx)
//	mux.Handle("POST /orders", idempotency.Middleware(store, idempotency.Options{
//		Caller: func(r *http.Request) string { return userID(r) },
//	})(http.HandlerFunc(createOrder)))
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx := idempotency.Tx(r.Context())
//		// ... the business write and outbox.Write(ctx, tx, ...), in tx ...
//		w.WriteHeader(http.StatusCreated)
//	}
//
// For each request the middleware begins a transaction (READ COMMITTED) and
// runs the handler in it. With a key it first takes a transaction-scoped
// advisory lock on the caller's key, so concurrent requests with one key,
// on any number of API instances, are decided by the database: the first
// runs, the others get 409 Conflict with Retry-After while it runs. A lock
// lives only as long as its transaction, so a crashed instance leaves no
// key behind. The rules, following the IETF httpapi Idempotency-Key draft
// and Stripe's API:
//
//   - a key is 1 to 255 printable ASCII characters, else 400;
//   - a key is honoured only for a caller: Options.Caller names the
//     authenticated caller of a request, the scope of its keys, and a keyed
//     request whose caller is "" (or any keyed request without a Caller) is
//     answered 401, so no one can replay another caller's response. An
//     application whose keys all share one scope says so with
//     Options.GlobalScope;
//   - a key seen before with another method, path, query string or body
//     (the request's fingerprint) is answered 422;
//   - a key seen before with the same request is answered with the stored
//     status, headers and body, plus the header Idempotent-Replayed: true,
//     and the handler does not run;
//   - keys expire after Options.TTL; Store.Purge deletes expired ones, and
//     should run periodically;
//   - a response is buffered up to Options.MaxResponse bytes (headers and
//     body); a larger one rolls the transaction back, nothing is stored, and
//     the client gets 500 with a problem document, so memory stays bounded
//     and a stored key always has its whole response;
//   - a response with status 500 or more rolls the transaction back and is
//     not stored, so the client may retry; any other response commits the
//     handler's writes and is stored with them. A handler that panics rolls
//     back, stores nothing, and the panic goes on up;
//   - a request without a key runs the handler in a transaction as well,
//     unless Options.Required answers it 400.
//
// Responses are buffered until the transaction ends, so the handler cannot
// stream (it gets no http.Flusher). Error responses of the middleware are
// application/problem+json documents.
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Header names of the protocol.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Defaults of Options.
const (
	DefaultTTL        = 24 * time.Hour
	DefaultRetryAfter = time.Second
	DefaultMaxBody    = 1 << 20
	// DefaultMaxResponse is the default of Options.MaxResponse.
	DefaultMaxResponse = 1 << 20
)

// Options configure Middleware. The zero value uses the defaults.
type Options struct {
	// Caller names the authenticated caller of a request, the scope of its
	// keys: the same key from two callers is two keys. Derive it from a
	// verified identity (a user or API client id), never from a value the
	// client chooses freely, and return "" for a request without one. A
	// keyed request whose caller is "" is answered 401. Default nil: every
	// keyed request is answered 401, unless GlobalScope is set.
	Caller func(*http.Request) string
	// GlobalScope puts every keyed request without a caller in one shared
	// scope: anyone who sends a key and the same request gets the stored
	// response of whoever sent it first. Set it only when all clients are
	// equally trusted (an internal service) and responses hold nothing one
	// client may not see of another's. Default false.
	GlobalScope bool
	// TTL is how long a key's response is kept; an expired key is treated
	// as never seen. Default DefaultTTL (24 h).
	TTL time.Duration
	// Required answers a request without a key 400 instead of running the
	// handler.
	Required bool
	// RetryAfter is the Retry-After of a 409 answered while the key's first
	// request runs, rounded up to whole seconds. Default DefaultRetryAfter.
	RetryAfter time.Duration
	// MaxBody is the largest request body, in bytes, read to fingerprint a
	// keyed request; a larger one is answered 413. Default DefaultMaxBody
	// (1 MiB).
	MaxBody int64
	// MaxResponse is the largest response, in bytes of headers and body,
	// the middleware buffers and stores; a larger one rolls the handler's
	// transaction back and is answered 500. Default DefaultMaxResponse
	// (1 MiB).
	MaxResponse int64
	// Methods are the request methods whose keys are honoured; other
	// methods ignore the header and run the handler in a transaction.
	// Default POST and PATCH.
	Methods []string
}

type txKey struct{}

// Tx returns the transaction of a request that Middleware passes to the
// handler, or nil outside Middleware. Write with it and do not commit or
// roll it back: the middleware does, after storing the response.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// WithTx returns a copy of ctx carrying tx as Tx returns it, to run a
// handler written for Middleware in a transaction of one's own: in a test,
// or a job without HTTP.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Middleware returns a middleware that runs handlers in a transaction on
// store's database and makes keyed requests idempotent, as the package
// documentation describes. The returned handlers are safe for concurrent
// use.
func Middleware(store *Store, o Options) func(http.Handler) http.Handler {
	if o.Caller == nil {
		o.Caller = func(*http.Request) string { return "" }
	}
	if o.MaxResponse <= 0 {
		o.MaxResponse = DefaultMaxResponse
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultRetryAfter
	}
	if o.MaxBody <= 0 {
		o.MaxBody = DefaultMaxBody
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	return func(next http.Handler) http.Handler {
		return &middleware{store: store, o: o, next: next}
	}
}

type middleware struct {
	store *Store
	o     Options
	next  http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	keyed := slices.Contains(m.o.Methods, r.Method)
	var key string
	var fp []byte
	if keyed {
		var status int
		var detail string
		if key, status, detail = parseKey(r.Header.Values(HeaderKey), m.o.Required); status != 0 {
			problem(w, status, detail)
			return
		}
		keyed = key != ""
	}
	caller := m.o.Caller(r)
	if keyed && caller == "" && !m.o.GlobalScope {
		problem(w, http.StatusUnauthorized, "an "+HeaderKey+" is honoured only for an authenticated caller")
		return
	}
	if keyed {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.o.MaxBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				problem(w, http.StatusRequestEntityTooLarge, "request body over "+strconv.FormatInt(m.o.MaxBody, 10)+" bytes")
			} else {
				problem(w, http.StatusBadRequest, "reading the request body: "+err.Error())
			}
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fp = fingerprint(r.Method, r.URL.Path, r.URL.RawQuery, body)
	}
	m.serve(w, r, caller, key, fp)
}

// serve runs the request in a transaction; key is empty for an unkeyed one.
func (m *middleware) serve(w http.ResponseWriter, r *http.Request, caller, key string, fp []byte) {
	ctx := r.Context()
	tx, err := m.store.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "database unavailable")
		return
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // after Commit, a no-op
	if key != "" {
		prev, err := m.store.acquire(ctx, tx, caller, key)
		switch {
		case errors.Is(err, errBusy):
			m.busy(w)
			return
		case err != nil:
			problem(w, http.StatusServiceUnavailable, "database unavailable")
			return
		case prev != nil && !bytes.Equal(prev.fingerprint, fp):
			problem(w, http.StatusUnprocessableEntity, "the idempotency key was used for another request (method, path or body)")
			return
		case prev != nil:
			prev.header.Set(HeaderReplayed, "true")
			prev.writeTo(w)
			return
		}
	}
	rec := &recorder{stored: stored{fingerprint: fp, header: http.Header{}}, max: m.o.MaxResponse}
	m.next.ServeHTTP(rec, r.WithContext(WithTx(ctx, tx)))
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if rec.over() {
		_ = tx.Rollback(ctx)
		problem(w, http.StatusInternalServerError, "the response is over "+strconv.FormatInt(m.o.MaxResponse, 10)+
			" bytes, more than the server buffers and stores for idempotency; its changes were rolled back")
		return
	}
	if rec.status >= 500 {
		_ = tx.Rollback(ctx)
		rec.writeTo(w)
		return
	}
	if key != "" {
		if err := m.store.store(ctx, tx, caller, key, rec.forStorage(), m.o.TTL); errors.Is(err, errBusy) {
			m.busy(w)
			return
		} else if err != nil {
			problem(w, http.StatusServiceUnavailable, "database unavailable")
			return
		}
	}
	if err := tx.Commit(ctx); err != nil {
		problem(w, http.StatusServiceUnavailable, "database unavailable: the request's changes were not committed")
		return
	}
	rec.writeTo(w)
}

// busy answers 409 with Retry-After: the key's first request runs.
func (m *middleware) busy(w http.ResponseWriter) {
	secs := (m.o.RetryAfter + time.Second - 1) / time.Second
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	problem(w, http.StatusConflict, "a request with this idempotency key is in progress; retry later")
}

// parseKey returns the key of the header values; a status and a detail when
// they are not one valid key, or when there is none and one is required.
func parseKey(values []string, required bool) (string, int, string) {
	switch {
	case len(values) == 0 && required:
		return "", http.StatusBadRequest, "this request requires an " + HeaderKey + " header"
	case len(values) == 0:
		return "", 0, ""
	case len(values) > 1:
		return "", http.StatusBadRequest, "more than one " + HeaderKey + " header"
	}
	key := values[0]
	if len(key) == 0 || len(key) > 255 {
		return "", http.StatusBadRequest, HeaderKey + " must be 1 to 255 characters long"
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", http.StatusBadRequest, HeaderKey + " must be printable ASCII"
		}
	}
	return key, 0, ""
}

// fingerprint identifies a request: its method, path, query string and
// body.
func fingerprint(method, path, query string, body []byte) []byte {
	b := sha256.Sum256(body)
	h := sha256.New()
	h.Write([]byte(method + " " + path + "?" + query + "\n"))
	h.Write(b[:])
	return h.Sum(nil)
}

// notStored are the response headers that a replay does not repeat.
var notStored = []string{"Set-Cookie", "Date", "Content-Length", "Connection", "Transfer-Encoding"}

// forStorage returns the response as stored: the headers without
// notStored, the body never nil.
func (s *stored) forStorage() *stored {
	c := *s
	c.header = s.header.Clone()
	for _, h := range notStored {
		c.header.Del(h)
	}
	if c.body == nil {
		c.body = []byte{}
	}
	return &c
}

// writeTo sends the response to the client.
func (s *stored) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range s.header {
		h[k] = v
	}
	w.WriteHeader(s.status)
	_, _ = w.Write(s.body)
}

// recorder is the http.ResponseWriter of the handler: it keeps the response
// until the transaction ends, at most max bytes of body and headers; past
// that it drops the body and over reports true.
type recorder struct {
	stored
	max      int64
	overflow bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.overflow || int64(len(r.body))+int64(len(b)) > r.max {
		r.overflow, r.body = true, nil
		return len(b), nil
	}
	r.body = append(r.body, b...)
	return len(b), nil
}

// over reports whether the response, headers included, is over max bytes.
func (r *recorder) over() bool {
	n := int64(len(r.body))
	for k, vs := range r.header {
		for _, v := range vs {
			n += int64(len(k) + len(v))
		}
	}
	return r.overflow || n > r.max
}

// problem answers status with an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}

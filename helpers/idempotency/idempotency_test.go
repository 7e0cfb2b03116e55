package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/helpers/idempotency"
	"github.com/outboxrelay/relay/helpers/internal/pgtest"
	"github.com/outboxrelay/relay/helpers/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is a database with the key store, an orders table and the outbox.
type env struct {
	dsn   string
	pool  *pgxpool.Pool
	store *idempotency.Store
}

func setup(t testing.TB) *env {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	e := &env{dsn: dsn}
	e.pool, e.store = e.connect(t)
	if err := e.store.CreateTable(ctx); err != nil {
		t.Fatal(err)
	}
	if err := outbox.CreateTable(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE orders (id uuid PRIMARY KEY, customer text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return e
}

// connect returns another pool on the database and a store using it, as a
// second API instance would have.
func (e *env) connect(t testing.TB) (*pgxpool.Pool, *idempotency.Store) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := idempotency.NewStore(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	return pool, store
}

// count returns the result of a count(*) query.
func (e *env) count(t testing.TB, query string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkRows checks how many orders, outbox rows and stored keys there are.
func (e *env) checkRows(t testing.TB, orders, keys int) {
	t.Helper()
	got := [3]int{e.count(t, "SELECT count(*) FROM orders"), e.count(t, "SELECT count(*) FROM outbox"),
		e.count(t, "SELECT count(*) FROM idempotency_keys")}
	if want := [3]int{orders, orders, keys}; got != want {
		t.Errorf("orders, outbox rows, keys = %v, want %v", got, want)
	}
}

// orders is the handler of POST /orders: it writes an order and its event
// in the request's transaction. before runs first, when set.
type orders struct {
	runs   atomic.Int32
	before func(r *http.Request) int // a status to answer at once, or 0
}

func (h *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	var in struct {
		Customer string `json:"customer"`
		Amount   int    `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Customer == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tx := idempotency.Tx(ctx)
	id := uuid.New().String()
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, amount) VALUES ($1, $2, $3)`, id, in.Customer, in.Amount); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if _, err := outbox.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: id,
		EventType: "order.created", Payload: in}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if h.before != nil {
		if status := h.before(r); status != 0 {
			w.WriteHeader(status)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+id)
	w.Header().Set("Set-Cookie", "session=secret")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// response is what a client got.
type response struct {
	status int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get(idempotency.HeaderReplayed) == "true" }

// post sends POST path with body and, unless empty, the key and caller.
func post(t testing.TB, h http.Handler, path, key, caller, body string) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	if caller != "" {
		req.Header.Set("X-Caller", caller)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return response{w.Code, w.Result().Header, w.Body.String()}
}

const order1 = `{"customer": "ada", "amount": 42}`

func byHeader(r *http.Request) string { return r.Header.Get("X-Caller") }

func TestReplay(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader})(h)
	first := post(t, mw, "/orders", "k1", "c1", order1)
	if first.status != http.StatusCreated || first.replayed() || first.header.Get("Set-Cookie") == "" {
		t.Fatalf("first: %+v", first)
	}
	for range 3 {
		again := post(t, mw, "/orders", "k1", "c1", order1)
		if again.status != http.StatusCreated || again.body != first.body || !again.replayed() ||
			again.header.Get("Location") != first.header.Get("Location") ||
			again.header.Get("Content-Type") != "application/json" || again.header.Get("Set-Cookie") != "" {
			t.Errorf("retry: %+v, want the first response %+v replayed without Set-Cookie", again, first)
		}
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	e.checkRows(t, 1, 1)
}

func TestKeyValidation(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h)
	for _, key := range []string{strings.Repeat("k", 256), "caf\u00e9", "tab\there", "\x7f"} {
		if got := post(t, mw, "/orders", key, "", order1); got.status != http.StatusBadRequest ||
			got.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("key %q: %d %s, want a 400 problem", key, got.status, got.body)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(order1))
	req.Header.Add(idempotency.HeaderKey, "a")
	req.Header.Add(idempotency.HeaderKey, "b")
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("two keys: %d, want 400", w.Code)
	}
	req.Header.Set(idempotency.HeaderKey, "")
	w = httptest.NewRecorder()
	mw.ServeHTTP(w, req)
	if w.Code != http.StatusBadRequest {
		t.Errorf("empty key: %d, want 400", w.Code)
	}
	if n := h.runs.Load(); n != 0 {
		t.Errorf("handler ran %d times for invalid keys", n)
	}
	for _, key := range []string{strings.Repeat("k", 255), " !~ quoted \"x\""} {
		if got := post(t, mw, "/orders", key, "", order1); got.status != http.StatusCreated {
			t.Errorf("key %q: %d %s, want 201", key, got.status, got.body)
		}
	}
}

func TestFingerprintMismatch(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h)
	if got := post(t, mw, "/orders", "k", "", order1); got.status != http.StatusCreated {
		t.Fatalf("first: %+v", got)
	}
	for _, r := range []struct{ path, body string }{
		{"/orders", `{"customer": "ada", "amount": 43}`},
		{"/orders/", order1},
		{"/other", order1},
	} {
		if got := post(t, mw, r.path, "k", "", r.body); got.status != http.StatusUnprocessableEntity {
			t.Errorf("%s %s: %d %s, want 422", r.path, r.body, got.status, got.body)
		}
	}
	req := httptest.NewRequest(http.MethodPatch, "/orders", strings.NewReader(order1))
	req.Header.Set(idempotency.HeaderKey, "k")
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, req)
	if w.Code != http.StatusUnprocessableEntity {
		t.Errorf("PATCH with a POST's key: %d, want 422", w.Code)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	e.checkRows(t, 1, 1)
}

// TestInProgress holds the first request in its handler while a second one
// with its key arrives.
func TestInProgress(t *testing.T) {
	e := setup(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := &orders{before: func(*http.Request) int { once.Do(func() { close(entered) }); <-release; return 0 }}
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true, RetryAfter: 1500 * time.Millisecond})(h)
	first := make(chan response, 1)
	go func() { first <- post(t, mw, "/orders", "k", "", order1) }()
	<-entered
	second := make(chan response, 1)
	go func() { second <- post(t, mw, "/orders", "k", "", order1) }()
	var busy response
	select {
	case busy = <-second:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the second request waits for the first instead of answering 409")
	}
	if busy.status != http.StatusConflict || busy.header.Get("Retry-After") != "2" {
		t.Errorf("while the first runs: %d Retry-After %q, want 409 and 2", busy.status, busy.header.Get("Retry-After"))
	}
	close(release)
	if got := <-first; got.status != http.StatusCreated || got.replayed() {
		t.Fatalf("first: %+v", got)
	}
	if got := post(t, mw, "/orders", "k", "", order1); !got.replayed() {
		t.Errorf("after the first: %+v, want a replay", got)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestConcurrentRequests sends 50 requests with one key at once, through two
// middlewares on two pools, as two API instances.
func TestConcurrentRequests(t *testing.T) {
	e := setup(t)
	h := &orders{before: func(*http.Request) int { time.Sleep(20 * time.Millisecond); return 0 }}
	_, store2 := e.connect(t)
	instances := []http.Handler{
		idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h),
		idempotency.Middleware(store2, idempotency.Options{GlobalScope: true})(h),
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make([]response, 50)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = post(t, instances[i%2], "/orders", "same-key", "", order1)
		}()
	}
	close(start)
	wg.Wait()
	var created, replayed, conflict int
	var body string
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			created++
			body = r.body
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict && r.header.Get("Retry-After") != "":
			conflict++
		default:
			t.Errorf("unexpected response %+v", r)
		}
	}
	if created != 1 {
		t.Fatalf("%d requests created an order, want 1 (%d replayed, %d conflicts)", created, replayed, conflict)
	}
	for _, r := range results {
		if r.replayed() && r.body != body {
			t.Errorf("replayed %s, want %s", r.body, body)
		}
	}
	t.Logf("1 created, %d replayed, %d conflicts", replayed, conflict)
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	e.checkRows(t, 1, 1)
}

// TestFailureThenRetry: a handler answering 500, or panicking, after its
// writes leaves no key and no writes; the retry runs the handler.
func TestFailureThenRetry(t *testing.T) {
	for _, how := range []string{"500", "panic"} {
		t.Run(how, func(t *testing.T) {
			e := setup(t)
			var fail atomic.Bool
			fail.Store(true)
			h := &orders{before: func(*http.Request) int {
				if !fail.Load() {
					return 0
				}
				if how == "panic" {
					panic(http.ErrAbortHandler)
				}
				return http.StatusInternalServerError
			}}
			srv := httptest.NewServer(idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h))
			defer srv.Close()
			send := func() (int, bool, error) {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(order1))
				req.Header.Set(idempotency.HeaderKey, "k")
				resp, err := srv.Client().Do(req)
				if err != nil {
					return 0, false, err
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, resp.Header.Get(idempotency.HeaderReplayed) == "true", nil
			}
			status, _, err := send()
			if how == "500" && status != http.StatusInternalServerError || how == "panic" && err == nil {
				t.Fatalf("failing attempt: %d, %v", status, err)
			}
			e.checkRows(t, 0, 0)
			fail.Store(false)
			if status, replayed, err := send(); status != http.StatusCreated || replayed || err != nil {
				t.Fatalf("retry: %d replayed %v, %v; want 201 from the handler", status, replayed, err)
			}
			if status, replayed, err := send(); status != http.StatusCreated || !replayed || err != nil {
				t.Fatalf("second retry: %d replayed %v, %v; want the replay", status, replayed, err)
			}
			if n := h.runs.Load(); n != 2 {
				t.Errorf("handler ran %d times, want 2", n)
			}
			e.checkRows(t, 1, 1)
		})
	}
}

// TestClientErrorStored: a 4xx response is stored and replayed.
func TestClientErrorStored(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h)
	for i := range 2 {
		got := post(t, mw, "/orders", "k", "", `{"amount": 1}`)
		if got.status != http.StatusBadRequest || got.replayed() != (i == 1) {
			t.Errorf("attempt %d: %+v, want 400, replayed the second time", i, got)
		}
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	e.checkRows(t, 0, 1)
}

func TestCallerScope(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader})(h)
	a := post(t, mw, "/orders", "k", "alice", order1)
	b := post(t, mw, "/orders", "k", "bob", order1)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || a.replayed() || b.replayed() || a.body == b.body {
		t.Errorf("two callers, one key: %+v and %+v, want two orders", a, b)
	}
	if again := post(t, mw, "/orders", "k", "bob", order1); !again.replayed() || again.body != b.body {
		t.Errorf("bob again: %+v, want bob's replay", again)
	}
	e.checkRows(t, 2, 2)
}

func TestRequired(t *testing.T) {
	e := setup(t)
	h := &orders{}
	optional := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h)
	required := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true, Required: true})(h)
	if got := post(t, required, "/orders", "", "", order1); got.status != http.StatusBadRequest {
		t.Errorf("required, no key: %d, want 400", got.status)
	}
	for range 2 {
		if got := post(t, optional, "/orders", "", "", order1); got.status != http.StatusCreated || got.replayed() {
			t.Errorf("optional, no key: %+v, want 201", got)
		}
	}
	req := httptest.NewRequest(http.MethodGet, "/orders", strings.NewReader(order1))
	w := httptest.NewRecorder()
	required.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		t.Errorf("GET without a key on a required route: %d, want the handler's 201", w.Code)
	}
	e.checkRows(t, 3, 0)
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true, TTL: time.Hour})(h)
	first := post(t, mw, "/orders", "k", "", order1)
	var ttl time.Duration
	if err := e.pool.QueryRow(ctx, `SELECT expires_at - created_at FROM idempotency_keys`).Scan(&ttl); err != nil || ttl != time.Hour {
		t.Errorf("stored for %v (%v), want 1h", ttl, err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	second := post(t, mw, "/orders", "k", "", `{"customer": "bob", "amount": 1}`)
	if second.status != http.StatusCreated || second.replayed() || second.body == first.body {
		t.Errorf("after expiry: %+v, want a new order", second)
	}
	if n := h.runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO idempotency_keys (caller, key, fingerprint, status, headers, body, expires_at)
		SELECT 'c', 'k' || i, '', 201, '{}', '', now() - interval '1 minute' FROM generate_series(1, 2500) i`); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.Purge(ctx); n != 2500 || err != nil {
		t.Errorf("Purge: %d, %v; want 2500", n, err)
	}
	if got := post(t, mw, "/orders", "k", "", `{"customer": "bob", "amount": 1}`); !got.replayed() || got.body != second.body {
		t.Errorf("the live key after Purge: %+v, want its replay", got)
	}
}

func TestNewStoreErrors(t *testing.T) {
	for _, bad := range []string{".x", "x."} {
		if _, err := idempotency.NewStore(nil, bad); err == nil {
			t.Errorf("NewStore(%q) succeeded", bad)
		}
	}
	s, err := idempotency.NewStore(nil, `app.keys "x"`)
	if err != nil || !strings.Contains(s.DDL(), `"app"."keys ""x"""`) {
		t.Errorf("DDL of a quoted name: %v\n%s", err, s.DDL())
	}
}

// BenchmarkCreateOrder measures a request that writes an order and its
// outbox row: plain (beginning and committing its own transaction), through
// the middleware without a key, and with a new key per request. Each
// iteration sends one request of each kind, in rotating order, so that the
// load of a shared machine weighs on all three alike; the metrics are the
// mean time of one request of each kind.
func BenchmarkCreateOrder(b *testing.B) {
	e := setup(b)
	h := &orders{}
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := e.pool.Begin(r.Context())
		if err != nil {
			b.Error(err)
			return
		}
		defer tx.Rollback(r.Context())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r.WithContext(idempotency.WithTx(r.Context(), tx)))
		if err := tx.Commit(r.Context()); err != nil {
			b.Error(err)
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
	mw := idempotency.Middleware(e.store, idempotency.Options{GlobalScope: true})(h)
	kinds := []struct {
		name  string
		h     http.Handler
		keyed bool
	}{{"plain", plain, false}, {"middleware-no-key", mw, false}, {"middleware-key", mw, true}}
	spent := make([]time.Duration, len(kinds))
	send := func(k int, i int) time.Duration {
		key := ""
		if kinds[k].keyed {
			key = fmt.Sprintf("%s-%d", b.Name(), i)
		}
		start := time.Now()
		if got := post(b, kinds[k].h, "/orders", key, "", order1); got.status != http.StatusCreated {
			b.Fatalf("%s: %+v", kinds[k].name, got)
		}
		return time.Since(start)
	}
	for i := range 300 { // warm up the pool's connections and the tables
		for k := range kinds {
			send(k, -i-1)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range kinds {
			k := (i + j) % len(kinds)
			spent[k] += send(k, i)
		}
	}
	for j, k := range kinds {
		b.ReportMetric(float64(spent[j].Nanoseconds())/float64(b.N), k.name+"-ns/req")
	}
}

// TestKeyNeedsCaller checks the default scoping: without a Caller, or with
// one that names no caller, a keyed request is answered 401 and runs
// nothing, an unkeyed one runs; and a caller who sends another caller's key
// and body gets an order of its own, never the other's response.
func TestKeyNeedsCaller(t *testing.T) {
	e := setup(t)
	h := &orders{}
	for _, mw := range []http.Handler{
		idempotency.Middleware(e.store, idempotency.Options{})(h),
		idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader})(h),
	} {
		if got := post(t, mw, "/orders", "k", "", order1); got.status != http.StatusUnauthorized {
			t.Errorf("a key without a caller: %+v, want 401", got)
		}
		if got := post(t, mw, "/orders", "", "", order1); got.status != http.StatusCreated {
			t.Errorf("no key, no caller: %+v, want 201", got)
		}
	}
	e.checkRows(t, 2, 0)
	mw := idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader})(h)
	alice := post(t, mw, "/orders", "k", "alice", order1)
	mallory := post(t, mw, "/orders", "k", "mallory", order1)
	if mallory.replayed() || mallory.body == alice.body || mallory.header.Get("Location") == alice.header.Get("Location") {
		t.Errorf("another caller with alice's key and body got %+v, alice got %+v", mallory, alice)
	}
}

// TestQueryInFingerprint checks that the query string is part of the
// request: the same key on another query is answered 422.
func TestQueryInFingerprint(t *testing.T) {
	e := setup(t)
	h := &orders{}
	mw := idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader})(h)
	if got := post(t, mw, "/orders", "k", "c", order1); got.status != http.StatusCreated {
		t.Fatalf("first: %+v", got)
	}
	if got := post(t, mw, "/orders?admin=1", "k", "c", order1); got.status != http.StatusUnprocessableEntity {
		t.Errorf("same key, another query: %+v, want 422", got)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestMaxResponse checks that a response over MaxResponse is neither kept
// nor stored: the handler's writes roll back, the client gets 500, and a
// retry runs the handler again.
func TestMaxResponse(t *testing.T) {
	e := setup(t)
	big := &orders{before: func(r *http.Request) int { return 0 }}
	wrap := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		big.ServeHTTP(w, r)
		w.Write(make([]byte, 2000))
	})
	mw := idempotency.Middleware(e.store, idempotency.Options{Caller: byHeader, MaxResponse: 1000})(wrap)
	for range 2 {
		got := post(t, mw, "/orders", "k", "c", order1)
		if got.status != http.StatusInternalServerError || len(got.body) > 1000 || !strings.Contains(got.body, "1000 bytes") {
			t.Errorf("oversized response: %d %q, want 500 naming the limit", got.status, got.body)
		}
	}
	if n := big.runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (nothing stored)", n)
	}
	e.checkRows(t, 0, 0)
}

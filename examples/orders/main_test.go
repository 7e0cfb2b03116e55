package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/testenv"
)

// relayBin is the relay binary, built once for the package's tests.
var relayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "orders-relay-")
	if err != nil {
		panic(err)
	}
	relayBin = filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", relayBin, "github.com/outboxrelay/relay/cmd/relay").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
		os.Exit(1)
	}
	testenv.OnExit(func() { os.RemoveAll(dir) })
	testenv.Main(m)
}

// TestRetriedOrderAppliedOnce follows one order from a retried HTTP request
// to the consumer: three attempts with one key make one order and one
// outbox row; the relay (with this example's relay.yaml) publishes it to
// NATS; the consumer applies it once, and once more only in the inbox when
// the event is delivered again.
func TestRetriedOrderAppliedOnce(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.NewDB(t)
	ns, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)

	// The example, serving and consuming in one process.
	var logs testenv.SyncBuffer
	runCtx, stop := context.WithCancel(ctx)
	exited := make(chan int, 1)
	go func() {
		exited <- run(runCtx, []string{"-listen", addr, "-database", dsn, "-consume", ns.URL(),
			"-tokens", "ada=" + adaToken + ",eve=" + eveToken}, &logs)
	}()
	defer func() {
		stop()
		if code := <-exited; code != 0 {
			t.Errorf("example exited %d", code)
		}
		if t.Failed() {
			t.Logf("example log:\n%s", logs.String())
		}
	}()

	// A key is honoured only for an authenticated caller: without a token
	// it is refused, and another caller's token with ada's key and body
	// makes eve's own order, never a replay of ada's.
	if status, body, _ := postOrder(t, addr, "order-key-1", ""); status != http.StatusUnauthorized {
		t.Fatalf("a key without a token: %d %s, want 401", status, body)
	}
	var ids []string
	for attempt := range 3 {
		status, body, replayed := postOrder(t, addr, "order-key-1", adaToken)
		if status != http.StatusCreated || replayed != (attempt > 0) {
			t.Fatalf("attempt %d: %d %s, replayed %v", attempt, status, body, replayed)
		}
		var resp struct{ ID string }
		if err := json.Unmarshal([]byte(body), &resp); err != nil || resp.ID == "" {
			t.Fatalf("attempt %d: body %s: %v", attempt, body, err)
		}
		ids = append(ids, resp.ID)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Errorf("ids %v, want one order", ids)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := count(t, pool, `SELECT count(*) FROM orders WHERE customer = 'ada'`) + "/" +
		count(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_type = 'order' AND event_type = 'order.created' AND aggregate_id = '`+ids[0]+`'`); got != "1/1" {
		t.Errorf("orders/outbox rows of the order = %s, want 1/1", got)
	}

	relay := exec.Command(relayBin, "run", "--config", "relay.yaml")
	relay.Env = append(os.Environ(), "DATABASE_URL="+dsn, "NATS_URL="+ns.URL())
	var relayLog testenv.SyncBuffer
	relay.Stdout, relay.Stderr = &relayLog, &relayLog
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = relay.Process.Kill()
		_ = relay.Wait()
		if t.Failed() {
			t.Logf("relay log:\n%s", relayLog.String())
		}
	}()

	const stats = `SELECT orders || '/' || amount FROM customer_stats WHERE customer = 'ada'`
	waitFor(t, "the consumer applies the order", func() bool { return count(t, pool, stats) == "1/42" })

	// A second delivery of the event, as after a relay crash before it
	// deleted the row: same message_id, a new JetStream message.
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "OUTBOX")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "outbox.order")
	if err != nil {
		t.Fatal(err)
	}
	again := nats.NewMsg("outbox.order")
	again.Data = msg.Data
	again.Header.Set("message_id", msg.Header.Get("message_id"))
	ack, err := js.PublishMsg(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer acknowledges the second delivery", func() bool {
		cons, err := js.Consumer(ctx, "OUTBOX", consumerName)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= ack.Sequence
	})
	if got := count(t, pool, stats); got != "1/42" {
		t.Errorf("customer stats after a second delivery = %s, want 1/42 (applied once)", got)
	}
	if got := count(t, pool, `SELECT count(*) FROM processed_messages`); got != "1" {
		t.Errorf("%s inbox records, want 1", got)
	}
	if !strings.Contains(logs.String(), "applied=false") {
		t.Error("the example did not log the second delivery as not applied")
	}

	// Another caller's token with ada's key and body makes eve's own order,
	// and a request with neither key nor token is served as the contract
	// says.
	if status, body, replayed := postOrder(t, addr, "order-key-1", eveToken); status != http.StatusCreated || replayed || strings.Contains(body, ids[0]) {
		t.Errorf("eve with ada's key: %d %s replayed %v, want an order of her own", status, body, replayed)
	}
	if status, body, _ := postOrder(t, addr, "", ""); status != http.StatusCreated {
		t.Errorf("no key, no token: %d %s, want 201", status, body)
	}
}

// The example's API tokens in the test.
const (
	adaToken = "ada-token-0123456789"
	eveToken = "eve-token-0123456789"
)

// postOrder posts the test's order with key and, unless empty, the bearer
// token, and returns the status, the body and whether the response was a
// replay.
func postOrder(t *testing.T, addr, key, token string) (int, string, bool) {
	t.Helper()
	var resp *http.Response
	waitFor(t, "the API answers", func() bool {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/orders",
			strings.NewReader(`{"customer": "ada", "amount": 42}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		var err error
		resp, err = http.DefaultClient.Do(req)
		return err == nil
	})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header.Get("Idempotent-Replayed") == "true"
}

// count returns the text of a one-value query, "" for no row.
func count(t *testing.T, pool *pgxpool.Pool, query string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), "SELECT coalesce(("+query+")::text, '')").Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

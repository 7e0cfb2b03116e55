package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/internal/testenv"
)

// sqlASCII creates a database whose text columns hold any bytes, as
// PostgreSQL's SQL_ASCII encoding allows: the way invalid UTF-8 reaches the
// relay.
const sqlASCII = "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"

// TestInvalidUTF8Row: in a SQL_ASCII database, rows whose aggregate_type,
// aggregate_id, event_type and headers hold invalid UTF-8 and control
// characters are published or dead-lettered, the events behind them in
// their aggregate and in other aggregates flow, /metrics and /readyz answer,
// and the relay never exits. Both capture modes.
func TestInvalidUTF8Row(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) { invalidUTF8Row(t, mode) })
	}
}

func invalidUTF8Row(t *testing.T, mode string) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: mode, DSN: testenv.NewDB(t, sqlASCII),
		Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 2\n  initial: 10ms\n"})
	relay := s.start()
	ctx := context.Background()
	// Each bad row is followed by a good one of its aggregate.
	bad := []struct{ typ, agg, evType, headers string }{
		{`E'bad\xff\xfe'`, `'a1'`, `'step'`, `NULL`},
		{`'order'`, `E'id\xff\x1b]0;title\x07'`, `'step'`, `NULL`},
		{`'order'`, `'a3'`, `E'\xc3('`, `NULL`},
		{`'order'`, `'a4'`, `'step'`, `E'{"h\xff": "v\xfe\\u001b[2J"}'`},
		{`E'new\nline\r\x1b[31m'`, `E'a5\x9b'`, `E'\xe2\x80\xae'`, `E'{"k": "\xf0\x9f"}'`},
	}
	var ids []string
	for i, b := range bad {
		for j, typ := range []string{b.typ, b.typ} {
			id, evType := uuid.NewString(), b.evType
			if j == 1 {
				evType = `'step'` // the good event behind the bad one
			}
			if _, err := s.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ($1, %s, %s, %s, '{"step": %d}', %s)`, typ, b.agg, evType, j, b.headers), id); err != nil {
				t.Fatalf("row %d: %v", i, err)
			}
			ids = append(ids, id)
		}
	}
	s.write(ctx, 7, 5) // a good aggregate after them all
	waitFor(t, func() bool {
		select {
		case <-relay.done:
			t.Fatalf("the relay exited: %v", relay.err)
		default:
		}
		return s.outboxRows() == 0
	})
	published := map[string]bool{}
	for _, d := range streamDeliveries(t, s.nats.URL()) {
		published[d.MessageID] = true
	}
	var dead []string
	rows, _ := s.pool.Query(ctx, `SELECT id::text, error FROM outbox_dead_letter`)
	for rows.Next() {
		var id, msg string
		rows.Scan(&id, &msg)
		dead = append(dead, id)
		t.Logf("dead letter %s: %s", id, msg)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	for _, id := range ids {
		if !published[id] && !strings.Contains(strings.Join(dead, " "), id) {
			t.Errorf("event %s neither published nor dead-lettered", id)
		}
	}
	if len(published) != len(ids)+5-len(dead) {
		t.Errorf("%d events published, %d dead-lettered, want %d in all", len(published), len(dead), len(ids)+5)
	}
	metrics := scrape(t, addr)
	if code := readyz(addr); code != 200 {
		t.Errorf("/readyz %d", code)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "relay_events_published_by_type_total") {
			t.Logf("%s", l)
		}
	}
	t.Logf("%s: %d published, %d dead-lettered, relay alive until SIGTERM", mode, len(published), len(dead))
}

// TestDLQListEscapes: `relay dlq list` shows a dead letter whose values hold
// terminal escape sequences, carriage returns, invalid UTF-8 and 10 MB with
// those escaped and cut: nothing reaches the terminal that could set its
// title, clear it or recolour it.
func TestDLQListEscapes(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{DSN: testenv.NewDB(t, sqlASCII)})
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO outbox_dead_letter
		(id, aggregate_type, aggregate_id, event_type, payload, error, error_class, attempts, first_failed_at, last_failed_at)
		VALUES ($1, E'\x1b]0;title\x07', E'id\r\x1b[2J\xff', repeat('e', 10000000), '{}', E'boom\x1b[31m\nred', 'permanent', 1, now(), now())`,
		uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	out, code := runRelay(t, "dlq", "list", "--config", s.cfgPath)
	if code != 0 {
		t.Fatalf("dlq list: exit %d\n%s", code, out)
	}
	if strings.ContainsAny(out, "\x1b\x07\r\xff") {
		t.Errorf("raw control characters or invalid UTF-8 in the output:\n%.2000q", out)
	}
	for _, want := range []string{`\x1b]0;title\a/id\r\x1b[2J\xff`, "eee...(10000000 bytes)", `boom\x1b[31m\nred`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%.2000s", want, out)
		}
	}
	if len(out) > 2000 {
		t.Errorf("%d bytes of output for one dead letter", len(out))
	}
}

// TestManyAggregateTypes: 20,000 distinct aggregate types make at most 32
// series of relay_events_published_by_type_total plus "other", and /metrics
// grows by a few kilobytes, not megabytes; a 1,000-character type and one
// with a newline and an escape sequence are labelled escaped and cut.
func TestManyAggregateTypes(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	ctx := context.Background()
	insert := func(types string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), t, 'a' || (n % 100), 'step', '{}' FROM `+types+` WITH ORDINALITY AS x(t, n)`); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return s.outboxRows() == 0 })
	}
	insert(`unnest(ARRAY[repeat('x', 1000), E'new\nline\x1b[31m'])`)
	before := len(scrape(t, addr))
	insert(`unnest(ARRAY(SELECT 'type-' || i FROM generate_series(1, 20000) i))`)
	metrics := scrape(t, addr)
	var series []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "relay_events_published_by_type_total{") {
			series = append(series, l)
		}
	}
	if len(series) > 33 {
		t.Errorf("%d series of relay_events_published_by_type_total, want at most 33", len(series))
	}
	for _, want := range []string{
		`aggregate_type="` + strings.Repeat("x", 64) + `...(1000 bytes)"`,
		`aggregate_type="new\\nline\\x1b[31m"`,
		`relay_events_published_by_type_total{aggregate_type="other",sink="nats"} `,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if grown := len(metrics) - before; grown > 10000 {
		t.Errorf("/metrics grew by %d bytes with 20,000 aggregate types", grown)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("/metrics %d bytes before the 20,000 types, %d after; %d series by type", before, len(metrics), len(series))
}

// TestHTTPTimeouts: the /metrics, /healthz and /readyz listener closes a
// keep-alive connection left idle, and one whose request headers never
// finish, instead of keeping them forever.
func TestHTTPTimeouts(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	idle, slow := dial(t, addr), dial(t, addr)
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive /healthz: %v %+v", err, resp)
	}
	fmt.Fprintf(slow, "GET /healthz HTTP/1.1\r\nHost: relay\r\n")
	start := time.Now()
	var wg sync.WaitGroup
	for name, c := range map[string]net.Conn{"idle keep-alive": idle, "unfinished headers": slow} {
		wg.Go(func() {
			c.SetReadDeadline(start.Add(2 * time.Minute))
			if _, err := io.ReadAll(c); err != nil {
				t.Errorf("%s connection not closed by the relay within 2 minutes: %v", name, err)
			}
			t.Logf("%s connection closed by the relay after %s", name, time.Since(start).Round(time.Second))
		})
	}
	wg.Wait()
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// dial opens a TCP connection to addr, closed when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

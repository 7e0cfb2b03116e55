package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/internal/verify"
)

// hugeValue is the SQL of a 2 MB text value that compresses to about
// 23 kB: more than an index row of the dead-letter table holds.
const hugeValue = `repeat(md5(random()::text), 65536)`

// countingReceiver is a webhook receiver that counts the requests of each
// message_id and refuses, with 400, an event whose aggregate id, aggregate
// type or event type is longer than 1 MB. It takes request headers of up
// to 64 MB, so that it sees such events rather than net/http refusing them.
type countingReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	posts map[string]int
}

func startCountingReceiver(t *testing.T) *countingReceiver {
	rc := &countingReceiver{posts: map[string]int{}}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.posts[r.Header.Get("message_id")]++
		rc.mu.Unlock()
		for _, h := range []string{"aggregate_id", "aggregate_type", "event_type"} {
			if len(r.Header.Get(h)) > 1<<20 {
				http.Error(w, h+" too long", http.StatusBadRequest)
				return
			}
		}
	}))
	rc.Config.MaxHeaderBytes = 64 << 20
	rc.Start()
	t.Cleanup(rc.Close)
	return rc
}

// count returns how many requests carried message_id id.
func (rc *countingReceiver) count(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.posts[id]
}

func (rc *countingReceiver) deliveries() []verify.Delivery { return nil }

// TestHugeRowValues writes, in one transaction among ordinary events,
// three rows with a 2 MB value: aggregate_id, aggregate_type and
// event_type. The receiver refuses them (400), so they go to the
// dead-letter table whole, next to the ordinary events, each published
// once and archived. A btree index on aggregate_id refused the first
// dead letter, which failed the archive of the whole batch: its events
// were published again and again and never archived.
func TestHugeRowValues(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			rc := startCountingReceiver(t)
			s := newStack(t, stackOptions{Mode: mode, Collect: rc.deliveries,
				Sink: fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events\n", rc.URL)})
			relay := s.start()
			ordinary, huge := s.writeHuge(t)
			s.waitSettled(t, relay, len(huge))
			s.checkHuge(t, rc, ordinary, huge, false)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
		})
	}
}

// TestEarlierDeadLetterIndex runs the relay on a dead-letter table with
// the btree index on aggregate_id of earlier releases: a dead letter with
// a 2 MB aggregate id is kept with its long values cut and an error saying
// so, and holds back none of its batch; `relay init` then replaces the
// index with the hash index, and the next such dead letter is kept whole.
func TestEarlierDeadLetterIndex(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			earlierDeadLetterIndex(t, mode)
		})
	}
}

func earlierDeadLetterIndex(t *testing.T, mode string) {
	rc := startCountingReceiver(t)
	s := newStack(t, stackOptions{Mode: mode, Collect: rc.deliveries,
		Sink: fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events\n", rc.URL)})
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `DROP INDEX IF EXISTS outbox_dead_letter_aggregate_hash_idx;
		CREATE INDEX IF NOT EXISTS outbox_dead_letter_aggregate_idx ON outbox_dead_letter (aggregate_id)`); err != nil {
		t.Fatal(err)
	}
	relay := s.start()
	ordinary, huge := s.writeHuge(t)
	s.waitSettled(t, relay, len(huge))
	s.checkHuge(t, rc, ordinary, huge, true)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(relay.logs.String(), "btree index") {
		t.Error("relay run did not warn of the btree index on aggregate_id")
	}

	s.init()
	var idx string
	if err := s.pool.QueryRow(ctx, `SELECT string_agg(c.relname || ' ' || a.amname, ',' ORDER BY c.relname) FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
		WHERE i.indrelid = 'outbox_dead_letter'::regclass AND i.indisvalid`).Scan(&idx); err != nil {
		t.Fatal(err)
	}
	if want := "outbox_dead_letter_aggregate_hash_idx btree,outbox_dead_letter_id_idx btree"; idx != want {
		t.Fatalf("indexes after relay init: %s, want %s", idx, want)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM outbox_dead_letter`); err != nil {
		t.Fatal(err)
	}
	relay = s.start()
	ordinary, huge = s.writeHuge(t)
	s.waitSettled(t, relay, len(huge))
	s.checkHuge(t, rc, ordinary, huge, false)
	relay.stop(t, 15*time.Second)
}

// writeHuge writes, in one transaction, ordinary events with three rows
// between them whose aggregate_id, aggregate_type and event_type are 2 MB
// long; it returns the ids of both kinds.
func (s *stack) writeHuge(t *testing.T) (ordinary, huge []string) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for i, col := range []string{"aggregate_id", "aggregate_type", "event_type", ""} {
		for range 5 {
			id := uuid.NewString()
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, 'order', $2, 'step', '{}')`, id, fmt.Sprintf("order-%d", i)); err != nil {
				t.Fatal(err)
			}
			ordinary = append(ordinary, id)
		}
		if col == "" {
			break
		}
		id := uuid.NewString()
		vals := map[string]string{"aggregate_type": "'order'", "aggregate_id": "'order-0'", "event_type": "'step'"}
		vals[col] = hugeValue
		if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, %s, %s, %s, '{}')`, vals["aggregate_type"], vals["aggregate_id"], vals["event_type"]), id); err != nil {
			t.Fatal(err)
		}
		huge = append(huge, id)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ordinary, huge
}

// waitSettled waits until the outbox is empty and the dead-letter table
// holds dead rows, failing when the relay exits.
func (s *stack) waitSettled(t *testing.T, relay *relayProc, dead int) {
	t.Helper()
	waitFor(t, func() bool {
		select {
		case <-relay.done:
			t.Fatalf("the relay exited: %v", relay.err)
		default:
		}
		return s.outboxRows() == 0 && s.deadLetters() == dead
	})
}

// checkHuge checks that each ordinary event was published once, each
// huge one once and dead-lettered, whole unless cut, when its aggregate
// id is then cut to schema.CutChars characters and its error says so.
func (s *stack) checkHuge(t *testing.T, rc *countingReceiver, ordinary, huge []string, cut bool) {
	t.Helper()
	for _, id := range append(ordinary, huge...) {
		if n := rc.count(id); n != 1 {
			t.Errorf("event %s published %d times, want once", id, n)
		}
	}
	for i, id := range huge {
		var agg, typ, evType int
		var msg string
		if err := s.pool.QueryRow(context.Background(), `SELECT octet_length(aggregate_id), octet_length(aggregate_type), octet_length(event_type), error
			FROM outbox_dead_letter WHERE id = $1`, id).Scan(&agg, &typ, &evType, &msg); err != nil {
			t.Fatalf("dead letter %s: %v", id, err)
		}
		got := []int{agg, typ, evType}[i]
		switch {
		case i == 0 && cut && (got != 200 || !strings.Contains(msg, "refused the row as it was") || !strings.Contains(msg, "aggregate_id (2097152 characters)")):
			t.Errorf("dead letter %s: aggregate_id of %d bytes, error %q; want it cut to 200 and the error saying so", id, got, msg)
		case !(i == 0 && cut) && got != 2<<20:
			t.Errorf("dead letter %s: value %d of %d bytes, want 2 MB", id, i, got)
		}
		if !strings.Contains(msg, "400") {
			t.Errorf("dead letter %s: error %q does not name the receiver's refusal", id, msg)
		}
	}
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestRetryAfterPausesOneURL: with a URL per aggregate, the receiver answers
// 429 with Retry-After: 60 for one aggregate's URL. That URL is paused; every
// other URL keeps receiving: all their events arrive well before the pause
// would have ended, and the paused URL got only the one request that asked
// for the pause.
func TestRetryAfterPausesOneURL(t *testing.T) {
	rc := startRefusingReceiver(t, func(agg string) (int, string) {
		if agg == "order-0" {
			return http.StatusTooManyRequests, "60"
		}
		return 0, ""
	})
	s := newStack(t, stackOptions{Collect: rc.deliveries,
		Sink: fmt.Sprintf("sink:\n  type: webhook\n  webhook:\n    url: %s/events/{aggregate_id}\n", rc.URL)})
	const events = 1000
	s.produce(context.Background(), events, 20, 4)
	var paused int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE aggregate_id = 'order-0'`).Scan(&paused); err != nil {
		t.Fatal(err)
	}
	relay := s.start()
	start := time.Now()
	for len(rc.deliveries()) < events-paused {
		if rc.refusals.Load() > 0 && time.Since(start) > 45*time.Second {
			t.Fatalf("%d of %d events of the other URLs delivered 45s after start: the pause of one URL held the others",
				len(rc.deliveries()), events-paused)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := rc.refusals.Load(); n != 1 {
		t.Errorf("the paused URL got %d requests within its pause, want 1", n)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("%d events of 19 URLs delivered in %v while one URL was paused for 60s", events-paused, time.Since(start).Round(time.Millisecond))
}

// TestArchiveFailureBacksOff: a trigger on the outbox raises on DELETE, so
// every archive fails with an error that is not one of the lasting classes
// (a missing grant or table). The relay must not republish the events in a
// loop: it backs off (retry.initial doubling to retry.max), reports not
// ready (/readyz 503, relay_capture_ready 0), logs the failure once, and
// archives everything once the trigger is dropped. Both capture modes.
func TestArchiveFailureBacksOff(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: mode, Extra: "retry:\n  initial: 100ms\n  max: 1s\nhttp:\n  listen: " + addr + "\n"})
			ctx := context.Background()
			for _, stmt := range []string{
				`CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'archiving refused by a trigger'; END$$`,
				`CREATE TRIGGER refuse_delete BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_delete()`,
			} {
				if _, err := s.pool.Exec(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			const events = 10
			s.produce(ctx, events, 2, 1)
			relay := s.start()
			waitFor(t, func() bool { return s.wire.Deliveries() >= events })
			waitFor(t, func() bool {
				return readyz(addr) == http.StatusServiceUnavailable && strings.Contains(scrape(t, addr), "\nrelay_capture_ready 0\n")
			})
			// With backoff capped at 1s, 5 seconds hold a handful of
			// republish rounds of the 10 events; a loop without backoff
			// republishes them hundreds of times.
			before := s.wire.Deliveries()
			time.Sleep(5 * time.Second)
			if n := s.wire.Deliveries() - before; n > 20*events {
				t.Errorf("%d deliveries of %d events in 5s while every archive failed: republished in a loop", n, events)
			}
			if _, err := s.pool.Exec(ctx, `DROP TRIGGER refuse_delete ON outbox`); err != nil {
				t.Fatal(err)
			}
			s.waitDrained(60 * time.Second)
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			logs := relay.logs.String()
			for _, line := range []string{"archiving fails", "archive failed; the batch's events"} {
				if n := strings.Count(logs, line); n != 1 {
					t.Errorf("%d log lines %q, want 1", n, line)
				}
			}
			if strings.Contains(logs, "capture failed, retrying") {
				t.Error("the failed archive was logged again as a capture failure")
			}
			t.Logf("%s: %d deliveries of %d events while archives failed and after", mode, s.wire.Deliveries(), events)
		})
	}
}

// TestHeldMaxAgeReleasesWAL: in wal mode, with a webhook URL per
// aggregate_type, the URL of type "gone" answers 404 for ever while the
// other type is delivered. With sink.held_max_age 3s, the held events of
// "gone" are dead-lettered with the reason once the URL has been broken that
// long, and the replication slot's confirmed position moves past them: the
// slot keeps no WAL for a route that never comes back.
func TestHeldMaxAgeReleasesWAL(t *testing.T) {
	rc := startRefusingReceiver(t, func(string) (int, string) { return 0, "" })
	gone := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(gone.Close)
	mux := http.NewServeMux()
	mux.Handle("/events/gone", gone.Config.Handler)
	mux.Handle("/", rc.Config.Handler)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: "wal", Collect: rc.deliveries,
		Sink:  fmt.Sprintf("sink:\n  type: webhook\n  held_max_age: 3s\n  webhook:\n    url: %s/events/{aggregate_type}\n", srv.URL),
		Extra: "http:\n  listen: " + addr + "\n"})
	relay := s.start()
	ctx := context.Background()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	start := time.Now()
	const held = 20
	for i := range held {
		if _, err := s.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES (gen_random_uuid(), 'gone', $1, 'step', '{}')`, fmt.Sprintf("g-%d", i%4)); err != nil {
			t.Fatal(err)
		}
	}
	var after string
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	s.produce(ctx, 500, 20, 4)
	waitFor(t, func() bool { return len(rc.deliveries()) >= 500 })
	if n := s.deadLetters(); n != 0 && time.Since(start) < 3*time.Second { // a loaded machine may take longer than that
		t.Fatalf("%d dead letters before sink.held_max_age", n)
	}
	if !strings.Contains(scrape(t, addr), "\nrelay_held_max_age_seconds 3\n") {
		t.Error("relay_held_max_age_seconds is not 3")
	}
	waitFor(t, func() bool { return s.deadLetters() == held })
	waitFor(t, func() bool {
		var past bool
		err := s.pool.QueryRow(ctx, `SELECT coalesce(bool_and(confirmed_flush_lsn >= $1::pg_lsn), false)
			FROM pg_replication_slots WHERE database = current_database()`, after).Scan(&past)
		return err == nil && past
	})
	var reason string
	if err := s.pool.QueryRow(ctx, `SELECT min(error) FROM outbox_dead_letter`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "sink.held_max_age") || !strings.Contains(reason, "404") {
		t.Errorf("dead letter reason %q", reason)
	}
	if n := s.outboxRows(); n != 0 {
		t.Errorf("%d rows left in the outbox", n)
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("%d events of a 404 route dead-lettered after sink.held_max_age 3s; the slot confirmed past them; reason %q", held, reason)
}

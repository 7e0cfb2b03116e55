package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// heldRoute is a webhook receiver with a URL per event_type whose URL of
// event type "gone" answers 404 while broken is set; the receiver behind it
// records every other delivery.
type heldRoute struct {
	*refusingReceiver
	broken  atomic.Bool
	refused atomic.Int64
	addr    string // the relay's HTTP listener
}

// count returns how many deliveries are of aggregates held reports.
func (rc *heldRoute) count(held func(aggregate string) bool) int {
	n := 0
	for _, d := range rc.deliveries() {
		if held(d.AggregateID) {
			n++
		}
	}
	return n
}

// heldStack returns a stack in mode publishing to a heldRoute, broken at
// first, with YAML sinkExtra in its sink block; probes back off to at most
// 1s.
func heldStack(t *testing.T, mode, sinkExtra string) (*stack, *heldRoute) {
	rc := &heldRoute{refusingReceiver: startRefusingReceiver(t, func(string) (int, string) { return 0, "" })}
	rc.broken.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events/gone" && rc.broken.Load() {
			rc.refused.Add(1)
			http.NotFound(w, r)
			return
		}
		rc.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rc.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: mode, Collect: rc.deliveries,
		Sink:  fmt.Sprintf("sink:\n  type: webhook\n%s  webhook:\n    url: %s/events/{event_type}\n", sinkExtra, srv.URL),
		Extra: fmt.Sprintf("retry:\n  initial: 100ms\n  max: 1s\nhttp:\n  listen: %s\n", rc.addr)})
	return s, rc
}

// writeHeld writes, for each aggregate of aggs, two events of type "gone"
// (held while the route is broken) and then two of type "step", which must
// wait for them.
func (s *stack) writeHeld(ctx context.Context, aggs []int) {
	s.t.Helper()
	for _, agg := range aggs {
		for _, typ := range []string{"gone", "step"} {
			if _, err := s.writeAs(ctx, agg, 2, typ); err != nil {
				s.t.Fatal(err)
			}
		}
	}
}

// metric returns the value of the unlabelled series name on the relay's
// /metrics, or -1 when it is missing or the relay does not answer yet.
func (rc *heldRoute) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + rc.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// writeBacklog commits, in one statement, steps events of type "gone" for
// each of aggregates aggregates (order-1000 on), step by step, and records
// them as written.
func (s *stack) writeBacklog(ctx context.Context, aggregates, steps int) {
	s.t.Helper()
	rows, err := s.pool.Query(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'order-' || a, 'gone', json_build_object('aggregate', 'order-' || a, 'step', k)
		FROM generate_series(1, $2::int) k, generate_series(1000, 999 + $1::int) a ORDER BY k, a
		RETURNING id::text, aggregate_id, (payload->>'step')::int`, aggregates, steps)
	if err != nil {
		s.t.Fatal(err)
	}
	for rows.Next() {
		var id, agg string
		var step int
		if err := rows.Scan(&id, &agg, &step); err != nil {
			s.t.Fatal(err)
		}
		s.wire.Written(id, agg, step)
	}
	if rows.Err() != nil {
		s.t.Fatal(rows.Err())
	}
}

// heldAggregates returns aggregates 100 to 100+n-1 and the test of an
// aggregate name being one of them.
func heldAggregates(n int) ([]int, func(string) bool) {
	aggs := make([]int, n)
	names := map[string]bool{}
	for i := range aggs {
		aggs[i] = 100 + i
		names[fmt.Sprintf("order-%d", 100+i)] = true
	}
	return aggs, func(a string) bool { return names[a] }
}

// slotLag returns how many bytes of WAL the stack's replication slot has
// not confirmed.
func (s *stack) slotLag(ctx context.Context) int64 {
	var lag int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE database = current_database()`).Scan(&lag); err != nil {
		s.t.Fatal(err)
	}
	return lag
}

// TestHeldRouteKeepsNoWAL: in wal mode, one route (the webhook URL of
// event type "gone") answers 404 while other events flow, and 20 MB of WAL
// is written meanwhile. The slot's confirmed position must move past the
// held events: its lag falls below 4 MB while the route is still broken.
// Once the route works, every held event, and the newer events of their
// aggregates that waited behind them, are delivered in per-aggregate
// order with the row ids as message ids, and archived.
func TestHeldRouteKeepsNoWAL(t *testing.T) {
	s, rc := heldStack(t, "wal", "")
	ctx := context.Background()
	relay := s.start()
	aggs, held := heldAggregates(10)
	s.writeHeld(ctx, aggs)
	s.produce(ctx, 400, 20, 4)
	others := func(a string) bool { return !held(a) }
	waitFor(t, func() bool { return rc.count(others) >= 400 })
	for _, stmt := range []string{`CREATE TABLE filler (x text)`,
		`INSERT INTO filler SELECT repeat(md5(i::text), 32) FROM generate_series(1, 20000) i`} {
		if _, err := s.pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	s.produce(ctx, 100, 20, 4)
	const bound = 4 << 20
	deadline := time.Now().Add(60 * time.Second)
	lag := s.slotLag(ctx)
	for ; lag >= bound; lag = s.slotLag(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("the slot holds %d bytes of WAL 60s after 20 MB were written while one route was broken (bound %d)", lag, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := rc.count(held); n != 0 {
		t.Fatalf("%d events of the held aggregates delivered while their route was broken", n)
	}
	if rc.refused.Load() == 0 {
		t.Fatal("the broken route was never tried")
	}
	rc.broken.Store(false)
	s.waitDrained(120 * time.Second)
	s.verify()
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("slot lag %d bytes while a route was broken; %d refused requests; %d deliveries", lag, rc.refused.Load(), len(rc.deliveries()))
}

// TestHeldBacklogLeavesOthers: 15,000 events of 500 aggregates wait in the
// outbox for a route that answers 404. Events of other routes written
// afterwards are delivered while it stays broken (before, the backlog
// filled the pipeline's window and stopped them), and once it works the
// backlog is delivered in per-aggregate order. Both capture modes.
func TestHeldBacklogLeavesOthers(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, rc := heldStack(t, mode, "")
			ctx := context.Background()
			const aggregates, steps = 500, 30
			s.writeBacklog(ctx, aggregates, steps)
			backlog := func(a string) bool { return strings.HasPrefix(a, "order-1") && len(a) == len("order-1000") }
			relay := s.start()
			start := time.Now()
			s.produce(ctx, 200, 20, 4)
			for rc.count(func(a string) bool { return !backlog(a) }) < 200 {
				if time.Since(start) > 90*time.Second {
					t.Fatalf("%d of 200 events of a working route delivered in 90s beside 15,000 held events",
						rc.count(func(a string) bool { return !backlog(a) }))
				}
				time.Sleep(100 * time.Millisecond)
			}
			took := time.Since(start)
			if n := rc.count(backlog); n != 0 {
				t.Fatalf("%d held events delivered while their route was broken", n)
			}
			rc.broken.Store(false)
			s.waitDrained(240 * time.Second)
			s.verify()
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			t.Logf("%s: 200 events of a working route delivered in %v beside 15,000 held ones; then all %d delivered",
				mode, took.Round(time.Millisecond), len(rc.deliveries()))
		})
	}
}

// TestHeldRouteKill9: the relay is killed with SIGKILL while it holds a
// broken route's events, restarted, and killed again while the recovered
// route's events are being published. Nothing is lost, every aggregate's
// events arrive in order with the row ids as message ids, and the outbox
// ends empty. Both capture modes.
func TestHeldRouteKill9(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, rc := heldStack(t, mode, "")
			ctx := context.Background()
			aggs, held := heldAggregates(20)
			others := func(a string) bool { return !held(a) }
			relay := s.start()
			s.writeHeld(ctx, aggs)
			s.produce(ctx, 200, 20, 4)
			waitFor(t, func() bool { return rc.count(others) >= 200 && rc.refused.Load() > 0 })
			relay.kill()
			relay = s.start()
			s.writeHeld(ctx, aggs)
			s.produce(ctx, 200, 20, 4)
			waitFor(t, func() bool { return rc.count(others) >= 400 })
			if n := rc.count(held); n != 0 {
				t.Fatalf("%d events of the held aggregates delivered while their route was broken", n)
			}
			rc.broken.Store(false)
			waitFor(t, func() bool { return rc.count(held) > 0 })
			relay.kill()
			relay = s.start()
			s.waitDrained(120 * time.Second)
			s.verify()
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			t.Logf("%s: %d deliveries, %d of the held aggregates, after two kill -9", mode, len(rc.deliveries()), rc.count(held))
		})
	}
}

// TestHeldMaxAgeFromTable: with sink.held_max_age 3s, the events of a route
// that stays broken wait in the outbox table, and once it has been broken
// that long they are read again and dead-lettered with the reason, each
// once (the copy kept as the probe is not dead-lettered twice), while the
// newer events of their aggregates, to a working route, are then
// delivered. Both capture modes.
func TestHeldMaxAgeFromTable(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			s, rc := heldStack(t, mode, "  held_max_age: 3s\n")
			ctx := context.Background()
			aggs, held := heldAggregates(4)
			relay := s.start()
			s.writeHeld(ctx, aggs)
			waitFor(t, func() bool { return s.deadLetters() == 2*len(aggs) && rc.count(held) == 2*len(aggs) })
			if n := s.outboxRows(); n != 0 {
				t.Errorf("%d rows left in the outbox", n)
			}
			var reason string
			if err := s.pool.QueryRow(ctx, `SELECT min(error) FROM outbox_dead_letter`).Scan(&reason); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(reason, "sink.held_max_age") {
				t.Errorf("dead letter reason %q", reason)
			}
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			if n := s.deadLetters(); n != 2*len(aggs) {
				t.Errorf("%d dead letters, want %d", n, 2*len(aggs))
			}
			t.Logf("%s: %d events dead-lettered after sink.held_max_age, %d newer ones delivered", mode, s.deadLetters(), rc.count(held))
		})
	}
}

// TestHeldReleaseCycles: three times, a route breaks while six aggregates
// have events for it (each two to the broken route, then two that wait
// behind them), other events flow meanwhile, and the route comes back.
// Every release must finish by itself, capture the held rows a bounded
// number of times (at most 1.5 captures per held event from the release
// until the outbox is empty), deliver nothing twice but the probes (the
// wal drain published again the rows the stopped stream had in flight),
// keep
// per-aggregate order, and leave the relay streaming: events written after
// the last release are delivered too. Both capture modes. Before, a
// release re-captured the same rows in a loop (thousands of captures for
// a few held events).
func TestHeldReleaseCycles(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, rc := heldStack(t, mode, "")
			ctx := context.Background()
			aggs, held := heldAggregates(6)
			others := func(a string) bool { return !held(a) }
			relay := s.start()
			const cycles = 3
			var captured float64
			heldEvents := 0
			for c := 1; c <= cycles; c++ {
				rc.broken.Store(true)
				refused := rc.refused.Load()
				s.writeHeld(ctx, aggs)
				heldEvents += 4 * len(aggs)
				s.produce(ctx, 100, 10, 2)
				waitFor(t, func() bool {
					return rc.count(others) >= 100*c && rc.refused.Load() > refused && rc.metric(t, "relay_held_aggregates") == float64(len(aggs))
				})
				before := rc.metric(t, "relay_events_captured_total")
				rc.broken.Store(false)
				s.waitDrained(90 * time.Second)
				captured += rc.metric(t, "relay_events_captured_total") - before
			}
			s.produce(ctx, 200, 20, 4)
			s.waitDrained(90 * time.Second)
			wire, _ := s.verify()
			if captured > 1.5*float64(heldEvents) {
				t.Errorf("the releases captured %.0f times for %d held events", captured, heldEvents)
			}
			if probes := cycles * 4; wire.Duplicates > probes { // each probe candidate's row is published again
				t.Errorf("%d duplicate deliveries, more than the %d probes'", wire.Duplicates, probes)
			}
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			t.Logf("%s: the releases captured %.0f times for %d held events; %d duplicate deliveries", mode, captured, heldEvents, wire.Duplicates)
		})
	}
}

// TestHeldBacklogRelease: 5,000 events of 100 aggregates, all to a route
// that answers 404, wait in the outbox for 10 s; then the route works.
// Every event is delivered in per-aggregate order, and the release
// captures at most 1.5 times per event (the captures before it, of the
// rows read before the route was found broken, are logged, not bounded:
// at most once per row). It logs how long the release took to drain the
// backlog. Both capture modes.
func TestHeldBacklogRelease(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, rc := heldStack(t, mode, "")
			ctx := context.Background()
			relay := s.start()
			const aggregates, steps = 100, 50
			s.writeBacklog(ctx, aggregates, steps)
			waitFor(t, func() bool { return rc.metric(t, "relay_held_aggregates") == aggregates })
			time.Sleep(10 * time.Second)
			before := rc.metric(t, "relay_events_captured_total")
			rc.broken.Store(false)
			released := time.Now()
			s.waitDrained(120 * time.Second)
			took := time.Since(released)
			s.verify()
			captured := rc.metric(t, "relay_events_captured_total")
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			const events = aggregates * steps
			if per := (captured - before) / events; per > 1.5 {
				t.Errorf("the release captured %.0f times for %d events: %.2f per event", captured-before, events, per)
			}
			t.Logf("%s: %d held events drained %v after the release; %.2f captures per event by the release, %.2f in all",
				mode, events, took.Round(10*time.Millisecond), (captured-before)/events, captured/events)
		})
	}
}

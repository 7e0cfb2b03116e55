package main

import (
	"context"
	"fmt"

	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// readyz returns the status of the relay's /readyz, or 0 when it does not
// answer.
func readyz(addr string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestBrokerOutage stops NATS for a few seconds while producers write, in
// both capture modes: the relay keeps running, reports not ready,
// dead-letters nothing, archives no row while nothing can be acknowledged,
// keeps no transaction open for more than a few seconds, and resumes
// promptly when NATS is back, without loss. RELAY_TEST_OUTAGE (a duration)
// lengthens the outage to measure the longest relay transaction.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	outage := 6 * time.Second
	if v := os.Getenv("RELAY_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("RELAY_TEST_OUTAGE: %v", err)
		}
		outage = d
	}
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			brokerOutage(t, mode, outage)
		})
	}
}

// maxRelayTx is the longest a relay transaction may last, or a relay
// session stay idle inside one, in the tests.
const maxRelayTx = 3 * time.Second

func brokerOutage(t *testing.T, mode string, outage time.Duration) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Mode: mode, LeastPrivilege: true, Extra: "http:\n  listen: " + addr + "\nretry:\n  max_attempts: 1\n"})
	s.wireGaps = true
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 4000, 500, 4); close(produced) }()
	s.waitPublishing()
	s.nats.Stop()
	stopped := time.Now()
	wctx, stopWatching := context.WithCancel(ctx)
	sessions := s.watchSessions(wctx)
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	// Archives of batches acknowledged before the stop may still finish;
	// after that, with no broker to acknowledge, no row may leave.
	time.Sleep(500 * time.Millisecond)
	during := s.outboxRows()
	time.Sleep(time.Until(stopped.Add(outage)))
	if n := s.outboxRows(); n < during {
		t.Fatalf("%d outbox rows left the table while NATS was down (%d → %d)", during-n, during, n)
	}
	stopWatching()
	held := sessions()
	if held.xact > maxRelayTx || held.idle > maxRelayTx {
		t.Fatalf("during a %s broker outage a relay transaction lasted %s (%s), a session was idle in one for %s",
			outage, held.xact, held.what, held.idle)
	}
	if err := s.nats.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	before := s.outboxRows()
	waitFor(t, func() bool { return s.outboxRows() < before })
	resumed := time.Since(back)
	<-produced
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.verify()
	var dead int
	s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letter`).Scan(&dead)
	if dead != 0 {
		t.Fatalf("%d events dead-lettered during a broker outage", dead)
	}
	t.Logf("broker outage (%s, %s): longest relay transaction %s, longest idle in transaction %s, at most %d relay sessions; publishing resumed %.2fs after NATS came back; %s",
		mode, outage, held.xact, held.idle, held.conns, resumed.Seconds(), s.stream.Check())
}

// TestConnectionsBounded runs a poll relay with batches of 10 rows and the
// default postgres.max_conns while NATS is down, so that hundreds of
// batches are in flight at once: the relay still opens at most 8
// connections, and publishes everything once NATS is back.
func TestConnectionsBounded(t *testing.T) {
	t.Parallel()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStack(t, stackOptions{Extra: "http:\n  listen: " + addr + "\n"})
	s.wireGaps = true
	rewriteDSN(t, s.cfgPath, "interval: 50ms", "interval: 50ms\n    batch_size: 10")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.nats.Stop()
	wctx, stopWatching := context.WithCancel(ctx)
	sessions := s.watchSessions(wctx)
	s.produce(ctx, 3000, 600, 4)
	time.Sleep(3 * time.Second)
	if err := s.nats.Start(); err != nil {
		t.Fatal(err)
	}
	s.waitDrained(60 * time.Second)
	stopWatching()
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.verify()
	if st := sessions(); st.conns > 8 {
		t.Fatalf("the relay opened %d connections, more than postgres.max_conns (8)", st.conns)
	} else {
		t.Logf("at most %d relay connections with batch_size 10", st.conns)
	}
}

// sessionStats is what watchSessions saw of the relay's sessions.
type sessionStats struct {
	xact  time.Duration // the longest-running transaction
	what  string        // that transaction's session
	idle  time.Duration // the longest spell idle in a transaction
	conns int           // the most sessions at once
}

// watchSessions samples the relay's sessions (application_name
// outbox-relay, followed by its HTTP address when it serves one) on the
// stack's database in pg_stat_activity until ctx ends;
// the function it returns waits for that and returns what it saw.
func (s *stack) watchSessions(ctx context.Context) func() sessionStats {
	var st sessionStats
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rows, err := s.pool.Query(ctx, `SELECT backend_type, coalesce(state, ''), left(query, 60),
				coalesce(extract(epoch FROM clock_timestamp() - xact_start), 0),
				CASE WHEN state LIKE 'idle in transaction%' THEN extract(epoch FROM clock_timestamp() - state_change) ELSE 0 END
				FROM pg_stat_activity WHERE application_name LIKE 'outbox-relay%' AND datname = current_database()`)
			if err != nil {
				continue
			}
			n := 0
			for rows.Next() {
				var typ, state, query string
				var xact, idle float64
				if rows.Scan(&typ, &state, &query, &xact, &idle) != nil {
					continue
				}
				n++
				if d := time.Duration(xact * float64(time.Second)); d > st.xact {
					st.xact, st.what = d, fmt.Sprintf("%s, %s: %s", typ, state, query)
				}
				st.idle = max(st.idle, time.Duration(idle*float64(time.Second)))
			}
			rows.Close()
			st.conns = max(st.conns, n)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() sessionStats {
		<-done
		return st
	}
}

// proxiedStack starts a Postgres cluster of the test's own (so it can be
// restarted) and a stack whose relay reaches it through a proxy.
func proxiedStack(t *testing.T) (*testenv.Postgres, *testenv.Proxy, *stack) {
	pg, err := testenv.StartPostgres(context.Background(), testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dsn, err := pg.CreateDatabase(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testenv.StartProxy(fmt.Sprintf("127.0.0.1:%d", pg.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	s := newStack(t, stackOptions{DSN: dsn})
	rewriteDSN(t, s.cfgPath, dsn, strings.Replace(dsn, fmt.Sprintf(":%d/", pg.Port()), fmt.Sprintf(":%d/", proxy.Port()), 1))
	return pg, proxy, s
}

// TestPostgresRestartAndCuts restarts Postgres and cuts the relay's
// database connections (through a proxy) while producers write: the relay
// reconnects and finishes without loss or order breaks.
func TestPostgresRestartAndCuts(t *testing.T) {
	t.Parallel()
	pg, proxy, s := proxiedStack(t)
	relay := s.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 6000, 500, 4); close(produced) }()
	s.waitPublishing()
	for i := range 3 {
		time.Sleep(400 * time.Millisecond)
		proxy.Cut()
		time.Sleep(400 * time.Millisecond)
		if i == 1 {
			if err := pg.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-produced
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	wire, _ := s.verify()
	t.Logf("postgres restart and 3 cuts: %s", wire)
}

// TestThreePollRelaysOneKilled runs three poll relays on one outbox, kills
// one with SIGKILL mid-stream, and checks that the others take over its
// partitions with no loss and per-aggregate order intact.
func TestThreePollRelaysOneKilled(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	relays := []*relayProc{s.start(), s.start(), s.start()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 12000, 600, 8); close(produced) }()
	waitFor(t, func() bool { return s.wire.Deliveries() >= 1000 })
	relays[1].kill()
	killed := time.Now()
	<-produced
	s.waitDrained(60 * time.Second)
	drained := time.Since(killed)
	for _, i := range []int{0, 2} {
		if code := relays[i].stop(t, 15*time.Second); code != 0 {
			t.Fatalf("relay %d exited %d", i, code)
		}
	}
	wire, _ := s.verify()
	busy := 0
	for _, i := range []int{0, 2} {
		if strings.Contains(relays[i].logs.String(), "published=0") {
			continue
		}
		busy++
	}
	t.Logf("three relays, one killed: %s; drained %.1fs after the kill; %d survivors published", wire, drained.Seconds(), busy)
}

// TestStallsAndCuts runs the relay's NATS and Postgres connections through
// proxies that stall and cut them while producers write.
func TestStallsAndCuts(t *testing.T) {
	t.Parallel()
	_, dbProxy, s := proxiedStack(t)
	s.wireGaps = true
	natsProxy, err := testenv.StartProxy(strings.TrimPrefix(s.nats.URL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(natsProxy.Close)
	rewriteDSN(t, s.cfgPath, s.nats.URL(), "nats://"+natsProxy.Addr())
	relay := s.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 6000, 500, 4); close(produced) }()
	s.waitPublishing()
	for _, fault := range []struct {
		name     string
		do, undo func()
		hold     time.Duration
	}{
		{"stall nats", natsProxy.Stall, natsProxy.Resume, 2 * time.Second},
		{"cut nats", natsProxy.Cut, func() {}, 0},
		{"stall postgres", dbProxy.Stall, dbProxy.Resume, 2 * time.Second},
		{"cut postgres", dbProxy.Cut, func() {}, 0},
	} {
		time.Sleep(400 * time.Millisecond)
		t.Log(fault.name)
		fault.do()
		time.Sleep(fault.hold)
		fault.undo()
	}
	<-produced
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	_, stream := s.verify()
	t.Logf("stalls and cuts: %s", stream)
}

// TestMetricsAndHealth scrapes /metrics, /healthz and /readyz of a running
// relay, and /debug/pprof/ where http.pprof is on (wal) and off (poll).
func TestMetricsAndHealth(t *testing.T) {
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			pprofOn := mode == "wal"
			s := newStack(t, stackOptions{Mode: mode, Extra: fmt.Sprintf("http:\n  listen: %s\n  pprof: %v\n", addr, pprofOn)})
			relay := s.start()
			defer relay.stop(t, 15*time.Second)
			s.produce(context.Background(), 200, 20, 2)
			s.waitDrained(30 * time.Second)
			if readyz(addr) != http.StatusOK {
				t.Fatal("not ready")
			}
			wants := []string{
				"relay_events_published_total 200", "relay_events_captured_total 200", "relay_sink_ready 1", "relay_capture_ready 1", "relay_build_info{commit=",
				"relay_publish_batch_duration_seconds_count", "relay_commit_to_ack_seconds_bucket",
				`relay_events_published_by_type_total{aggregate_type="order",sink="nats"} 200`, "relay_oldest_unpublished_age_seconds",
			}
			if mode == "poll" {
				wants = append(wants, "relay_partitions_held 16")
			} else {
				wants = append(wants, "relay_capture_leader 1", "relay_replication_slot_lag_bytes", `relay_replication_slot_wal_status{status="reserved"} 1`,
					"relay_replication_slot_active 1", "relay_replication_slot_retained_wal_bytes", "relay_replication_slot_wal_keep_size_bytes",
					"relay_replication_slot_safe_wal_fraction", "relay_replication_slot_stalled_seconds", `relay_replication_slot_stall_recoveries_total{action="drain"} 0`)
			}
			body := waitMetrics(t, addr, wants...)
			t.Logf("scrape (%s):\n%s", mode, relayLines(body))
			resp, err := http.Get("http://" + addr + "/healthz")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("healthz: %v %v", resp, err)
			}
			resp, err = http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := map[bool]int{true: http.StatusOK, false: http.StatusNotFound}[pprofOn]; resp.StatusCode != want {
				t.Errorf("/debug/pprof/heap with http.pprof %v: status %d, want %d", pprofOn, resp.StatusCode, want)
			}
		})
	}
}

// waitMetrics scrapes addr's /metrics until the scrape holds every one of
// wants, for up to 60 seconds, and returns it; it fails t naming the ones
// still missing. A series that a background loop sets (the slot guard's
// readings, the sink's readiness) may be absent from the first scrapes.
func waitMetrics(t *testing.T, addr string, wants ...string) string {
	t.Helper()
	var body string
	var missing []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		body, missing = get(addr, "/metrics"), nil
		for _, want := range wants {
			if !strings.Contains(body, want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s, metrics lack %q:\n%s", missing, relayLines(body))
		}
	}
}

// relayLines returns the relay's own samples of a scrape, without histogram
// buckets.
func relayLines(body string) string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "relay_") && !strings.Contains(line, "_bucket") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestBrokerOutageUnderLoad stops NATS for 12 seconds while producers
// commit about 1,500 events a second, in both capture modes, and starts it
// again while they still write. The destinations (the subject and the
// broker) reopen in whatever order their probes find them working; the
// relay must publish every event, in per-aggregate order, and drain the
// outbox by itself. Before, a wal relay could stop for good after the
// release that followed such an outage, with thousands of rows left.
func TestBrokerOutageUnderLoad(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stackOptions{Mode: mode, Extra: "retry:\n  max: 1s\n"})
			relay := s.start()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() {
				defer close(produced)
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				for i := 0; i < 2000 && ctx.Err() == nil; i++ {
					<-tick.C
					for a := range 15 {
						if _, err := s.write(ctx, (i*15+a)%300, 1); err != nil && ctx.Err() == nil {
							t.Error(err)
							return
						}
					}
				}
			}()
			s.waitPublishing()
			time.Sleep(2 * time.Second)
			s.nats.Stop()
			time.Sleep(12 * time.Second)
			if err := s.nats.Start(); err != nil {
				t.Fatal(err)
			}
			<-produced
			s.waitDrained(120 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			s.verify()
			t.Logf("%s: %s", mode, s.stream.Check())
		})
	}
}

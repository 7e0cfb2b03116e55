package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// The ring of the tests' archive mode partition (see stackOptions.Archive):
// ringPartitions partitions of ringRows rows each.
const (
	ringPartitions = 4
	ringRows       = 1000
)

// truncationsCounted matches a scrape whose relay_outbox_truncations_total is not 0.
var truncationsCounted = regexp.MustCompile(`(?m)^relay_outbox_truncations_total(\{[^}]*\})? [1-9]`)

// partitionStack returns a wal-mode stack in archive mode partition whose
// relay runs as a role with only the grants `relay init --dry-run --role`
// prints, listening on the returned address.
func partitionStack(t *testing.T) (*stack, string) {
	t.Helper()
	s := newStack(t, stackOptions{Mode: "wal", Archive: "partition", LeastPrivilege: true})
	return s, s.withHTTP()
}

// TestPartitionKill runs archive mode partition while producers write a
// few thousand events and kills the relay with SIGKILL three times: once early, then twice after
// the running relay truncated a partition. Nothing is lost, every copy
// carries its row's id, per-aggregate order holds, the ring ends with every
// partition but the newest empty, and no row was ever deleted one by one
// (the outbox partitions' n_tup_del stays 0). The relay runs with exactly
// the grants `relay init --dry-run --role` prints, which include TRUNCATE
// on every partition and SELECT on the seq sequence.
func TestPartitionKill(t *testing.T) {
	t.Parallel()
	s, addr := partitionStack(t)
	checkPartitionGrants(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stop atomic.Bool
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		// At least 2,000 events, and more until the kills are done, so
		// that partitions are truncated while producers write. They
		// write about 200 events a second, and wait for the relay to come
		// within half a partition of them: a partition is truncated a few
		// seconds after its last row is published (three truncator
		// ticks), and one that the ring came round to meanwhile holds a
		// newer row and is kept.
		for n := 0; n < 10000 && ctx.Err() == nil && (n < 2000 || !stop.Load()); n += 100 {
			s.produce(ctx, 100, 100, 4)
			time.Sleep(500 * time.Millisecond)
			for ctx.Err() == nil && len(s.wire.Check().Missing) > ringRows/2 {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	const kills = 3
	for i := range kills {
		relay := s.start()
		if i == 0 {
			s.waitPublishing()
		} else {
			waitFor(t, func() bool { return truncationsCounted.MatchString(get(addr, "/metrics")) })
		}
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		relay.kill()
	}
	stop.Store(true)
	relay := s.start()
	<-produced
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(120 * time.Second)
	s.waitRingTruncated()
	s.finish(relay, addr)
	s.checkNoDeletes(relay)
	t.Logf("archive mode partition, kill -9 %d times: %s; stream: %s", kills, s.wire.Check(), s.stream.Check())
}

// TestPartitionBrokerOutage cuts the relay off from NATS (a proxy that
// stops accepting and drops its connections; the test's subscriber stays
// connected) for 6 seconds while producers write, in archive mode
// partition: /readyz follows the broker, nothing is dead-lettered or lost,
// the relay drains by itself once NATS is back, truncates the published
// partitions (counted in relay_outbox_truncations_total and logged with the
// partition's name) and deletes no row; relay status does not count the
// published rows the ring holds as unpublished.
func TestPartitionBrokerOutage(t *testing.T) {
	t.Parallel()
	s, addr := partitionStack(t)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(s.nats.URL(), "nats://"))
	rewriteDSN(t, s.cfgPath, s.nats.URL(), "nats://"+proxy.Addr())
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	produced := make(chan struct{})
	go func() { s.produce(ctx, 3000, 100, 4); close(produced) }()
	s.waitPublishing()
	proxy.Down()
	stopped := time.Now()
	waitFor(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	t.Logf("/readyz 503 %s after the broker went away", time.Since(stopped).Round(100*time.Millisecond))
	time.Sleep(time.Until(stopped.Add(6 * time.Second)))
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	<-produced
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(90 * time.Second)
	s.waitRingTruncated()
	if !truncationsCounted.MatchString(get(addr, "/metrics")) {
		t.Errorf("relay_outbox_truncations_total is 0 after the ring was truncated:\n%s", relayLines(get(addr, "/metrics")))
	}
	if !truncationLogged(relay.logs.String()) {
		t.Errorf("no INFO line names a truncated outbox partition")
	}
	// The rows the ring still holds are published: relay status does not
	// count them as a backlog, whose age would make the relay unhealthy.
	if out, code := runRelay(t, "status", "--config", s.cfgPath, "--max-age", "1s"); code != 0 || strings.Contains(out, "unpublished,") {
		t.Errorf("relay status with the ring's rows all published: exit %d, want 0 and no unpublished rows:\n%s", code, out)
	}
	s.finish(relay, addr)
	if n := s.deadLetters(); n != 0 {
		t.Errorf("%d events dead-lettered during a broker outage", n)
	}
	s.checkNoDeletes(relay)
	t.Logf("archive mode partition, 6s broker outage: %s", s.wire.Check())
}

// truncationLogged reports whether logs hold an INFO line about the
// truncation of one of the ring's partitions, naming it.
func truncationLogged(logs string) bool {
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=INFO") && strings.Contains(strings.ToLower(line), "truncat") &&
			strings.Contains(line, "outbox_p") {
			return true
		}
	}
	return false
}

// checkPartitionGrants fails unless `relay init --dry-run --role` lists,
// for the stack's role, TRUNCATE on each partition of the ring and SELECT
// on the seq sequence.
func checkPartitionGrants(t *testing.T, s *stack) {
	t.Helper()
	out, code := runRelay(t, "init", "--dry-run", "--role", s.role, "--config", s.cfgPath)
	if code != 0 {
		t.Fatalf("relay init --dry-run --role: exit %d\n%s", code, out)
	}
	want := []string{`GRANT SELECT ON SEQUENCE [^\n]*outbox_seq_seq[^\n]* TO "?` + s.role}
	for p := range ringPartitions {
		want = append(want, fmt.Sprintf(`GRANT [^\n;]*\bTRUNCATE\b[^\n;]* ON TABLE "?public"?\."?outbox_p%d"? TO "?%s`, p, s.role))
	}
	for _, w := range want {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("relay init --dry-run --role lists no %s:\n%s", w, out)
		}
	}
}

// waitRingTruncated waits until every partition of the ring but the one
// holding the newest row is empty, while that one keeps its rows: the
// relay truncated every partition it had published, and deleted none of
// the newest partition's published rows.
func (s *stack) waitRingTruncated() {
	s.t.Helper()
	q := fmt.Sprintf(`SELECT count(*) FILTER (WHERE (seq / %[1]d) %% %[2]d <> (SELECT (max(seq) / %[1]d) %% %[2]d FROM outbox)),
		count(*) FROM outbox`, ringRows, ringPartitions)
	var others, rows int
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := s.pool.QueryRow(context.Background(), q).Scan(&others, &rows); err != nil {
			s.t.Fatal(err)
		}
		if others == 0 && rows > 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("after 90s, %d of the outbox's %d rows are in partitions other than the newest; want 0 of more than 0", others, rows)
		}
	}
}

// checkNoDeletes fails when rows were deleted from the ring's partitions
// one by one (n_tup_del), which archive mode partition never does outside
// a drain. relay is the last relay run, whose log is searched for a drain.
func (s *stack) checkNoDeletes(relay *relayProc) {
	s.t.Helper()
	var partitions int
	var deleted int64
	err := s.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(n_tup_del), 0)::bigint FROM pg_stat_user_tables
		WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'outbox'::regclass)`).Scan(&partitions, &deleted)
	if err != nil {
		s.t.Fatal(err)
	}
	if partitions != ringPartitions {
		s.t.Errorf("the outbox has %d partitions, want %d", partitions, ringPartitions)
	}
	if deleted != 0 {
		s.t.Errorf("%d outbox rows deleted one by one in archive mode partition, want 0 (a drain in the last run's log: %v)",
			deleted, strings.Contains(relay.logs.String(), "through the poll path"))
	}
}

// TestPartitionWrapAndRedrive writes 6,000 events, a malformed one among
// them, before the relay starts, so that the 4×1000 ring wraps: every
// partition holds rows of two turns. The relay publishes them all in
// per-aggregate order, dead-letters the malformed one and truncates the
// ring behind them. The dead-lettered row is still in the newest partition
// when it is repaired and redriven: it goes back into the outbox and is
// published with its id. (Before, redrive took the row left in the outbox
// for the redriven copy: it removed the dead letter and inserted nothing;
// and it needs USAGE on the seq sequence, which it names first.)
func TestPartitionWrapAndRedrive(t *testing.T) {
	t.Parallel()
	s, addr := partitionStack(t)
	ctx := context.Background()
	// relay dlq redrive first names the grants it lacks, as an insert
	// into the ring needs the sequence too.
	out, code := runRelay(t, "dlq", "redrive", "--config", s.cfgPath, "--all")
	for _, want := range []string{`INSERT ON TABLE "public"."outbox"`, `GRANT USAGE ON SEQUENCE "public"."outbox_seq_seq"`} {
		if code != 1 || !strings.Contains(out, want) {
			t.Fatalf("dlq redrive without the grants: exit %d, want 1 naming %s:\n%s", code, want, out)
		}
	}
	if _, err := s.pool.Exec(ctx, "GRANT INSERT ON outbox TO "+s.role+"; GRANT USAGE ON SEQUENCE outbox_seq_seq TO "+s.role); err != nil {
		t.Fatal(err)
	}
	s.produce(ctx, 2000, 50, 2)
	poison := s.insertPoison(t)
	s.produce(ctx, 4000, 50, 2)
	relay := s.start()
	waitFor(t, func() bool { return len(s.wire.Check().Missing) == 1 && s.deadLetters() == 1 })
	s.waitRingTruncated()
	if _, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letter SET headers = '{"trace":"t"}' WHERE id = $1`, poison); err != nil {
		t.Fatal(err)
	}
	if out, code := runRelay(t, "dlq", "redrive", "--config", s.cfgPath, "--id", poison); code != 0 || !strings.Contains(out, "redrove 1") {
		t.Fatalf("dlq redrive of a dead letter whose row the ring still holds: exit %d, want 0 and redrove 1\n%s", code, out)
	}
	s.produce(ctx, 500, 50, 2)
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(60 * time.Second)
	s.waitRingTruncated()
	s.finish(relay, addr)
	t.Logf("archive mode partition, ring wrapped before the start, one event dead-lettered and redriven: %s", s.wire.Check())
}

package wal_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// producer writes events over aggregates; each aggregate's steps commit in
// order. It records what it wrote in a verify.Log.
type producer struct {
	pool  *pgxpool.Pool
	log   *verify.Log
	mu    sync.Mutex
	steps map[string]int
	n     int
}

func newProducer(pool *pgxpool.Pool) *producer {
	return &producer{pool: pool, log: verify.NewLog(), steps: map[string]int{}}
}

// write commits n events in transactions of 1 to 3 events over aggregates
// agg-<first>…agg-<first+aggs-1>.
func (p *producer) write(t testing.TB, n, first, aggs int) {
	t.Helper()
	ctx := context.Background()
	for written := 0; written < n; {
		agg := fmt.Sprintf("agg-%d", first+rand.IntN(aggs))
		k := min(1+rand.IntN(3), n-written)
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		type row struct {
			id   string
			step int
		}
		var rows []row
		p.mu.Lock()
		for range k {
			p.steps[agg]++
			rows = append(rows, row{uuid.NewString(), p.steps[agg]})
		}
		p.mu.Unlock()
		for _, r := range rows {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, 'order', $2, 'step', $3)`, r.id, agg, fmt.Sprintf(`{"step":%d}`, r.step)); err != nil {
				t.Error(err)
				tx.Rollback(ctx)
				return
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
			return
		}
		for _, r := range rows {
			p.log.Written(r.id, agg, r.step)
		}
		written += k
	}
	p.mu.Lock()
	p.n += n
	p.mu.Unlock()
}

// writeTolerant commits one transaction of 1 to 3 events over aggregates
// agg-<first>…agg-<first+aggs-1>, which only this goroutine writes, with
// steps counted in steps. Events whose COMMIT failed with the connection
// are recorded as maybe written.
func (p *producer) writeTolerant(steps map[string]int, first, aggs int) {
	ctx := context.Background()
	agg := fmt.Sprintf("agg-%d", first+rand.IntN(aggs))
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		time.Sleep(50 * time.Millisecond)
		return
	}
	defer tx.Rollback(ctx)
	var ids []string
	for i := range 1 + rand.IntN(3) {
		id := uuid.NewString()
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', $2, 'step', $3)`, id, agg, fmt.Sprintf(`{"step":%d}`, steps[agg]+1+i)); err != nil {
			return
		}
		ids = append(ids, id)
	}
	err = tx.Commit(ctx)
	for i, id := range ids {
		if err == nil {
			p.log.Written(id, agg, steps[agg]+1+i)
		} else {
			p.log.MaybeWritten(id, agg, steps[agg]+1+i)
		}
	}
	steps[agg] += len(ids) // also after an unknown outcome: a gap never reads as an order break
}

// concurrently runs k producers writing n events each over disjoint
// aggregates, so each aggregate's commit order is its step order.
func (p *producer) concurrently(t testing.TB, k, n, aggs int) {
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() { p.write(t, n, i*aggs, aggs) })
	}
	wg.Wait()
}

// waitDelivered waits until every written event was delivered, then checks
// loss, order and ids.
func (p *producer) waitDelivered(t testing.TB, d time.Duration) verify.Report {
	t.Helper()
	var r verify.Report
	waitFor(t, d, "every event delivered", func() bool {
		r = p.log.Check()
		return len(r.Missing) == 0
	})
	if err := r.Err(); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	return r
}

// TestSlotDroppedWhileStopped writes rows before the slot ever existed,
// while streaming, while the slot is gone and during the recovery: every
// event arrives, in per-aggregate order, and the outbox ends empty.
func TestSlotDroppedWhileStopped(t *testing.T) {
	pool := setup(t, layout)
	p := newProducer(pool)
	p.write(t, 60, 0, 10) // before the slot exists
	o := options(t, pool, layout, 7)
	snk := &recorder{log: p.log}
	src := newSource(t, o)
	stop := run(t, src, snk)
	p.concurrently(t, 4, 40, 10)
	p.waitDelivered(t, 20*time.Second)
	stop()
	src.Close()
	waitFor(t, 5*time.Second, "the walsender to exit", func() bool { return !slotActive(t, pool, o.Slot) })
	mustExec(t, pool, `SELECT pg_drop_replication_slot($1)`, o.Slot)
	p.write(t, 60, 0, 40) // while the slot is gone
	o.Logger = testLog(t)
	src = newSource(t, o)
	var wg sync.WaitGroup
	wg.Go(func() { p.concurrently(t, 4, 50, 10) }) // during the recovery
	run(t, src, snk)
	wg.Wait()
	r := p.waitDelivered(t, 30*time.Second)
	t.Logf("%s", r)
	waitFor(t, 10*time.Second, "the outbox to be archived", func() bool { return count(t, pool, "outbox") == 0 })
	waitFor(t, 5*time.Second, "the drain to be finished", func() bool { return count(t, pool, "outbox_relay_drain") == 0 })
}

// TestSlotDroppedWhileStreaming drops the slot of a running source: it
// recreates the slot, counts it as dropped (the timeline did not change, so
// not as a failover) and publishes the rows written while it was missing.
func TestSlotDroppedWhileStreaming(t *testing.T) {
	pool := setup(t, layout)
	p := newProducer(pool)
	o := options(t, pool, layout, 7)
	o.Logger = testLog(t)
	snk := &recorder{log: p.log}
	src := newSource(t, o)
	run(t, src, snk)
	p.write(t, 20, 0, 5)
	p.waitDelivered(t, 20*time.Second)
	waitFor(t, 10*time.Second, "the slot to be dropped", func() bool {
		_, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid), pg_drop_replication_slot(slot_name)
			FROM pg_replication_slots WHERE slot_name = $1`, o.Slot)
		return err == nil
	})
	p.write(t, 40, 0, 5) // while the slot is missing, or once it was recreated
	t.Logf("%s", p.waitDelivered(t, 30*time.Second))
	if got := src.SlotRecreated(wal.RecreatedDropped); got != 1 {
		t.Errorf("SlotRecreated(dropped) = %d, want 1", got)
	}
	if got := src.SlotRecreated(wal.RecreatedFailover); got != 0 {
		t.Errorf("SlotRecreated(failover) = %d, want 0", got)
	}
}

// TestCrashDuringDrain stops a source in the middle of a drain, with a
// drained batch unarchived: the next source finishes the drain, in order,
// before streaming.
func TestCrashDuringDrain(t *testing.T) {
	pool := setup(t, layout)
	var want []string
	for i := range 20 {
		want = append(want, insert(t, pool, "a", i))
	}
	o := options(t, pool, layout, 5)
	src := newSource(t, o)
	complete(t, next(t, src, 10*time.Second))
	if b := next(t, src, 10*time.Second); b == nil || len(b.Events()) != 5 {
		t.Fatalf("second drained batch %v", b)
	} // left unarchived: Close abandons it
	src.Close()
	if n := count(t, pool, "outbox_relay_drain"); n != 1 {
		t.Fatalf("%d pending drains after the crash, want 1", n)
	}
	o.Logger = testLog(t)
	src = newSource(t, o)
	bs := collect(t, src, 15, 10*time.Second)
	if got := ids(events(bs)); fmt.Sprint(got) != fmt.Sprint(want[5:]) {
		t.Fatalf("after restart got %v, want %v", got, want[5:])
	}
	for _, b := range bs {
		complete(t, b)
	}
	last := insert(t, pool, "a", 20)
	b := next(t, src, 10*time.Second)
	if b == nil || fmt.Sprint(ids(b.Events())) != fmt.Sprint([]string{last}) || b.Events()[0].Position < 1000 {
		t.Fatalf("after the drain got %v, want %s streamed", b, last)
	}
	if n := count(t, pool, "outbox_relay_drain"); n != 0 {
		t.Fatalf("%d pending drains after the drain, want 0", n)
	}
}

// TestStandbyTakesOver runs two sources: the second waits while the first
// streams, and takes over from the confirmed position when it closes.
func TestStandbyTakesOver(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 10)
	leader := newStreaming(t, o)
	o.Logger = testLog(t)
	standby := newSource(t, o)
	got := make(chan string, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if b, err := standby.Next(ctx); err == nil {
				for _, ev := range b.Events() {
					got <- ev.ID
				}
			}
		}
	}()
	insert(t, pool, "a", 0)
	complete(t, collect(t, leader, 1, 10*time.Second)[0])
	var want []string // streamed by the leader, left unarchived
	for i := range 5 {
		want = append(want, insert(t, pool, "a", i+1))
	}
	collect(t, leader, 5, 10*time.Second)
	// A standby waiting for the leader's lock does nothing observable, so
	// only a window can show that it captures nothing meanwhile.
	time.Sleep(1500 * time.Millisecond)
	select {
	case id := <-got:
		t.Fatalf("the standby captured %s while the leader streams", id)
	default:
	}
	closed := time.Now()
	leader.Close()
	var seen []string
	timeout := time.After(20 * time.Second)
	for len(seen) < len(want) {
		select {
		case id := <-got:
			seen = append(seen, id)
		case <-timeout:
			t.Fatalf("standby got %v, want the unarchived %v", seen, want)
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("standby got %v, want the unarchived %v", seen, want)
	}
	if took := time.Since(closed); took > 15*time.Second {
		t.Fatalf("takeover took %s", took)
	} else {
		t.Logf("standby took over in %s", took.Round(time.Millisecond))
	}
}

// TestReconnectAfterWalsenderEnds terminates the walsender: Next fails
// with a retryable error, and the next call resumes from the confirmed
// position.
func TestReconnectAfterWalsenderEnds(t *testing.T) {
	pool := setup(t, layout)
	o := options(t, pool, layout, 10)
	src := newStreaming(t, o)
	a := insert(t, pool, "a", 1)
	complete(t, collect(t, src, 1, 10*time.Second)[0])
	b := insert(t, pool, "a", 2)
	var end string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the walsender to send b", func() bool { // b may be handed out, is not archived
		var sent bool
		err := pool.QueryRow(context.Background(), `SELECT r.sent_lsn >= $2::pg_lsn FROM pg_stat_replication r
			JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`, o.Slot, end).Scan(&sent)
		return err == nil && sent
	})
	mustExec(t, pool, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, o.Slot)
	c := insert(t, pool, "a", 3)
	var got []string                 // first deliveries; b may come twice
	seen := map[string]bool{a: true} // a was archived and confirmed
	failures := 0
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		batch, err := src.Next(ctx)
		cancel()
		if err != nil {
			if fault.ClassOf(err) == fault.Permanent {
				t.Fatalf("permanent error: %v", err)
			}
			failures++
			continue
		}
		for _, ev := range batch.Events() {
			if !seen[ev.ID] {
				seen[ev.ID] = true
				got = append(got, ev.ID)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]string{b, c}) || failures == 0 {
		t.Fatalf("got %v after %d failures, want [%s %s] after at least one", got, failures, b, c)
	}
}

// ownCluster starts a cluster with opts for tests that restart or break it
// or need a version or settings of their own, with an outbox and a pool on
// database postgres.
func ownCluster(t *testing.T, opts testenv.PostgresOptions) (*testenv.Postgres, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	pool, err := pgxpool.New(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mustExec(t, pool, layout.CreateOutbox())
	mustExec(t, pool, layout.CreatePollIndex())
	return pg, pool
}

// TestPostgresRestartMidStream restarts Postgres while producers write and
// the pipeline publishes: the source reconnects and nothing is lost or
// reordered.
func TestPostgresRestartMidStream(t *testing.T) {
	pg, pool := ownCluster(t, testenv.PostgresOptions{})
	p := newProducer(pool)
	o := options(t, pool, layout, 20)
	snk := &recorder{log: p.log}
	run(t, newSource(t, o), snk)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 4 {
		wg.Go(func() {
			steps := map[string]int{}
			for ctx.Err() == nil {
				p.writeTolerant(steps, i*10, 10)
			}
		})
	}
	waitFor(t, 10*time.Second, "events flowing", func() bool { return snk.n.Load() > 200 })
	if err := pg.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted := snk.n.Load()
	waitFor(t, 30*time.Second, "events published after the restart", func() bool { return snk.n.Load() > restarted+200 })
	cancel()
	wg.Wait()
	t.Logf("%s", p.waitDelivered(t, 30*time.Second))
}

// TestLostSlotRecovered runs its own cluster with max_slot_wal_keep_size
// 1MB and makes the slot lose its WAL while no relay runs: the next source
// drops and recreates it and publishes the backlog in order.
func TestLostSlotRecovered(t *testing.T) {
	ctx := context.Background()
	_, pool := ownCluster(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1MB"}})
	mustExec(t, pool, `CREATE TABLE other (x text)`)
	p := newProducer(pool)
	o := options(t, pool, layout, 10)
	snk := &recorder{log: p.log}
	src := newSource(t, o)
	stop := run(t, src, snk)
	p.concurrently(t, 3, 30, 5)
	p.waitDelivered(t, 20*time.Second)
	stop()
	src.Close()
	p.write(t, 40, 0, 15) // in the outbox, and in WAL that will be removed
	for range 4 {
		mustExec(t, pool, `INSERT INTO other SELECT repeat('x', 1000) FROM generate_series(1, 2000)`)
		mustExec(t, pool, `SELECT pg_switch_wal()`)
	}
	mustExec(t, pool, `CHECKPOINT`)
	var status string
	if err := pool.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, o.Slot).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "lost" {
		t.Fatalf("wal_status %s, want lost", status)
	}
	o.Logger = testLog(t)
	src = newSource(t, o)
	run(t, src, snk)
	p.write(t, 20, 0, 15)
	t.Logf("%s", p.waitDelivered(t, 30*time.Second))
	if got := src.SlotRecreated(wal.RecreatedLost); got != 1 {
		t.Errorf("SlotRecreated(lost) = %d, want 1", got)
	}
	waitFor(t, 5*time.Second, "the slot's health to show it reserved", func() bool {
		return src.Slot().WALStatus == "reserved"
	})
}

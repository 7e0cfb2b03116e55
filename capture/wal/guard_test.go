package wal_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// TestSlotStateAndWarnings reads the slot's WAL guardrails while a relay
// streams, and from a relay that does not stream while nobody does: the
// retained WAL grows, safe_wal_size shrinks within max_slot_wal_keep_size,
// and the slot reads inactive. An unlimited max_slot_wal_keep_size is a
// warning of wal.Warnings; a bounded one is not.
func TestSlotStateAndWarnings(t *testing.T) {
	ctx := context.Background()
	_, pool := ownCluster(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "256MB"}})
	if ws := wal.Warnings(ctx, pool); len(ws) != 0 {
		t.Errorf("warnings with max_slot_wal_keep_size 256MB: %v", ws)
	}
	mustExec(t, pool, `CREATE TABLE other (x text)`)
	o := options(t, pool, layout, 10)
	src := newSource(t, o)
	stop := run(t, src, &recorder{log: verify.NewLog()})
	var st wal.SlotState
	defer func() {
		if t.Failed() {
			t.Logf("last observed: %+v", st)
		}
	}()
	waitFor(t, 30*time.Second, "an active, reserved slot with its keep size", func() bool {
		st = src.Slot()
		return st.Exists && st.Active && st.WALStatus == "reserved" && st.KeepSize == 256<<20 &&
			st.SafeWALSize > st.KeepSize/2 && st.RetainedBytes >= 0 && st.LagBytes >= 0 && !st.Failover
	})
	t.Logf("streaming: %+v", st)
	stop()
	src.Close()

	o.Logger = testLog(t)
	idle := newSource(t, o) // never calls Next: it watches without streaming
	waitFor(t, 30*time.Second, "the idle slot to read inactive", func() bool {
		st = idle.Slot()
		return st.Exists && !st.Active
	})
	before := st
	mustExec(t, pool, `INSERT INTO other SELECT md5(g::text) FROM generate_series(1, 200000) g`)
	waitFor(t, 30*time.Second, "the idle slot to retain more WAL, with less safe", func() bool {
		st = idle.Slot()
		return st.RetainedBytes > before.RetainedBytes+(10<<20) && st.SafeWALSize < before.SafeWALSize-(10<<20)
	})
	t.Logf("idle: %+v", st)
	insert(t, pool, "a", 1)
	waitFor(t, 10*time.Second, "the slot to read stalled: confirmed does not move while the outbox holds a row", func() bool {
		return idle.Slot().StalledFor > 300*time.Millisecond
	})
	if n := idle.StallRecoveries(wal.StallReconnect) + idle.StallRecoveries(wal.StallDrain); n != 0 {
		t.Errorf("a relay that does not stream took %d stall recovery steps", n)
	}

	shared := setup(t, layout)
	var keep string
	if err := shared.QueryRow(ctx, `SHOW max_slot_wal_keep_size`).Scan(&keep); err != nil {
		t.Fatal(err)
	}
	ws := wal.Warnings(ctx, shared)
	if keep == "-1" && (len(ws) != 1 || !strings.Contains(ws[0].Fix, "ALTER SYSTEM SET max_slot_wal_keep_size")) {
		t.Errorf("max_slot_wal_keep_size -1: warnings %v, want one with the ALTER SYSTEM statement", ws)
	}
	if keep != "-1" {
		t.Fatalf("the shared cluster's max_slot_wal_keep_size is %s; this test expects the default -1", keep)
	}
}

// TestStallRecovered stalls the replication connection (a proxy that stops
// forwarding but keeps it open) while rows keep coming: the relay
// reconnects, and since the new connection stalls too, publishes the
// outbox from the table; once the network recovers it streams again.
// Nothing is lost or reordered.
func TestStallRecovered(t *testing.T) {
	pool := setup(t, layout)
	proxy := replProxy(t, pool)
	p := newProducer(pool)
	o := options(t, pool, layout, 10)
	o.ReplConfig = replThrough(pool, proxy)
	o.StallAfter = time.Second
	src := newStreaming(t, o)
	snk := &recorder{log: p.log}
	run(t, src, snk)
	p.concurrently(t, 2, 20, 5)
	p.waitDelivered(t, 30*time.Second)
	waitFor(t, 10*time.Second, "the relay to stream", func() bool { return slotActive(t, pool, o.Slot) })

	proxy.Stall()
	p.concurrently(t, 2, 20, 5)
	r := p.waitDelivered(t, 60*time.Second)
	t.Logf("during the stall: %s", r)
	if src.StallRecoveries(wal.StallReconnect) < 1 || src.StallRecoveries(wal.StallDrain) < 1 {
		t.Fatalf("stall recoveries: reconnect %d, drain %d; want both", src.StallRecoveries(wal.StallReconnect), src.StallRecoveries(wal.StallDrain))
	}
	// Delivered rows are archived a moment later.
	waitFor(t, 10*time.Second, "the delivered rows to leave the outbox", func() bool { return count(t, pool, "outbox") == 0 })

	proxy.Resume()
	waitFor(t, 30*time.Second, "the relay to stream again", func() bool { return slotActive(t, pool, o.Slot) })
	drains := src.StallRecoveries(wal.StallDrain)
	p.concurrently(t, 2, 20, 5)
	t.Logf("after the stall: %s", p.waitDelivered(t, 30*time.Second))
	waitFor(t, 10*time.Second, "the stream to confirm past the new rows", func() bool { return src.Slot().StalledFor == 0 && count(t, pool, "outbox") == 0 })
	if got := src.StallRecoveries(wal.StallDrain); got != drains {
		t.Errorf("%d more drains after the network recovered", got-drains)
	}
}

// TestBrokerOutageIsNoStall keeps the broker down while rows wait in the
// outbox: the pipeline leaves them in the table for the drain (the broken
// destination holds them there), recorded in the drain table, so the slot
// is not stalled and the relay takes no stall recovery step; once the
// broker is back they are delivered.
func TestBrokerOutageIsNoStall(t *testing.T) {
	pool := setup(t, layout)
	p := newProducer(pool)
	o := options(t, pool, layout, 10)
	o.StallAfter = 300 * time.Millisecond
	src := newStreaming(t, o)
	snk := &downSink{recorder: recorder{log: p.log}, down: make(chan struct{})}
	run(t, src, snk)
	p.write(t, 10, 0, 3)
	waitFor(t, 20*time.Second, "the rows to be left for the drain", func() bool {
		var to *int64
		err := pool.QueryRow(context.Background(), `SELECT max(drain_to) FROM `+layout.DrainTable().Ident()).Scan(&to)
		return err == nil && to != nil && *to >= 10
	})
	time.Sleep(10 * o.StallAfter) // what a stall recovery would take several times over
	if st := src.Slot().StalledFor; st > 2*o.StallAfter {
		t.Errorf("the slot reads stalled for %v while the rows wait for the drain", st)
	}
	if n := src.StallRecoveries(wal.StallReconnect) + src.StallRecoveries(wal.StallDrain); n != 0 {
		t.Fatalf("%d stall recovery steps during a broker outage", n)
	}
	close(snk.down)
	p.waitDelivered(t, 30*time.Second)
}

// downSink fails as unavailable until down is closed.
type downSink struct {
	recorder
	down chan struct{}
}

func (s *downSink) Publish(ctx context.Context, batch []*event.Event) error {
	select {
	case <-s.down:
		return s.recorder.Publish(ctx, batch)
	default:
		return fault.AsUnavailable(errors.New("broker down"))
	}
}

// replProxy returns a proxy in front of pool's server.
func replProxy(t *testing.T, pool *pgxpool.Pool) *testenv.Proxy {
	t.Helper()
	c := pool.Config().ConnConfig
	proxy, err := testenv.StartProxy(net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return proxy
}

// replThrough returns pool's connection config pointed at proxy.
func replThrough(pool *pgxpool.Pool, proxy *testenv.Proxy) *pgconn.Config {
	c := pool.Config().ConnConfig.Config.Copy()
	c.Host, c.Port, c.Fallbacks = "127.0.0.1", uint16(proxy.Port()), nil
	return c
}

// TestFailoverSlot checks capture.wal.failover on PostgreSQL 17: a new slot
// (of Setup, as `relay init` makes it, or of the source) is created with
// failover enabled, and an existing slot without it gets it
// when the relay starts streaming.
func TestFailoverSlot(t *testing.T) {
	ctx := context.Background()
	bin, err := testenv.PostgresBin(17)
	if err != nil {
		t.Fatal(err)
	}
	_, pool := ownCluster(t, testenv.PostgresOptions{Bin: bin})
	failover := func(slot string) bool {
		var on bool
		if err := pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&on); err != nil {
			t.Fatal(err)
		}
		return on
	}

	o := options(t, pool, layout, 10)
	if err := wal.Setup(ctx, pool, table.Layout(layout), o.Slot, o.Publication, true); err != nil {
		t.Fatal(err)
	}
	if !failover(o.Slot) {
		t.Error("Setup with failover created a slot with failover off")
	}
	o = options(t, pool, layout, 10)
	o.Failover = true
	src := newStreaming(t, o)
	if !failover(o.Slot) {
		t.Error("a slot created with Failover has failover off")
	}
	waitFor(t, 30*time.Second, "Slot to report failover", func() bool { return src.Slot().Failover })
	src.Close()

	o = options(t, pool, layout, 10)
	src = newStreaming(t, o)
	src.Close()
	if failover(o.Slot) {
		t.Fatal("a slot created without Failover has failover on")
	}
	waitFor(t, 30*time.Second, "the walsender to end", func() bool { return !slotActive(t, pool, o.Slot) })
	o.Failover, o.Logger = true, testLog(t)
	newStreaming(t, o)
	if !failover(o.Slot) {
		t.Error("Failover did not enable failover on the existing slot")
	}
}

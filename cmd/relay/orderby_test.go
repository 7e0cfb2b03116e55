package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// tenantOutbox is the contract's outbox with a bigint tenant_id, the
// ordering key of these tests.
const tenantOutbox = testenv.ContractOutbox + `; ALTER TABLE outbox ADD COLUMN tenant_id bigint`

// orderByYAML sets outbox.order_by to tenant_id.
const orderByYAML = "outbox:\n  order_by: tenant_id\n"

// TestOrderByTenant runs relay run with outbox.order_by: tenant_id into
// Kafka in both capture modes, with a kill -9 in the middle: every record's
// key is its tenant (the aggregate_id header stays the aggregate), and each
// tenant's events, written by interleaving four aggregates, arrive in
// commit order.
func TestOrderByTenant(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newTenantStack(t, mode)
			tp := newTenantProducer(s, 12)
			tp.produce(600, 3)
			relay := s.start()
			s.waitPublishing()
			relay.kill()
			tp.produce(600, 3)
			relay = s.start()
			s.waitDrained(90 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			wire, _ := s.verify()
			t.Logf("%s: %s", mode, wire)
		})
	}
}

// newTenantStack returns a stack in capture mode mode on a new database
// whose outbox has tenant_id, with outbox.order_by tenant_id and a Kafka
// sink collected by tenantRecords.
func newTenantStack(t *testing.T, mode string) *stack {
	t.Helper()
	dsn := testenv.NewDB(t)
	execDSN(t, dsn, tenantOutbox)
	k, err := kafkatest.Start(kafkatest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return newStack(t, stackOptions{DSN: dsn, Mode: mode, Extra: orderByYAML, Collect: tenantRecords(k),
		Sink: fmt.Sprintf("sink:\n  type: kafka\n  kafka:\n    brokers: [%s]\n    partitions: 4\n", k.Addrs()[0])})
}

// tenantRecords collects k's records as deliveries of their key (the
// tenant), failing those whose key is not the payload's tenant or whose
// aggregate_id header is not an aggregate of it.
func tenantRecords(k *kafkatest.Cluster) func() []verify.Delivery {
	return func() []verify.Delivery {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		recs, err := k.Records(ctx, "outbox.")
		if err != nil {
			return nil
		}
		var ds []verify.Delivery
		for _, r := range recs {
			id, _ := r.Header("message_id")
			agg, _ := r.Header("aggregate_id")
			d := payloadDelivery(id, string(r.Key), r.Value)
			if !strings.HasPrefix(agg, "t"+string(r.Key)+"-a") {
				d.Problem = fmt.Sprintf("aggregate_id %q is not an aggregate of tenant %q", agg, r.Key)
			}
			ds = append(ds, d)
		}
		return ds
	}
}

// tenantProducer writes events of tenants, each over four aggregates, and
// records them per tenant in the stack's log.
type tenantProducer struct {
	s       *stack
	tenants int
	mu      sync.Mutex
	steps   map[int]int
}

func newTenantProducer(s *stack, tenants int) *tenantProducer {
	return &tenantProducer{s: s, tenants: tenants, steps: map[int]int{}}
}

// produce writes n events from producers goroutines, each owning some
// tenants and committing 1–3 events of one tenant per transaction, each of
// a random aggregate of it.
func (p *tenantProducer) produce(n, producers int) {
	var wg sync.WaitGroup
	for g := range producers {
		wg.Go(func() {
			for written := 0; written < n/producers; {
				tenant := g + producers*rand.IntN(p.tenants/producers)
				written += p.write(tenant, min(1+rand.IntN(3), n/producers-written))
			}
		})
	}
	wg.Wait()
}

func (p *tenantProducer) write(tenant, n int) int {
	ctx := context.Background()
	tx, err := p.s.pool.Begin(ctx)
	if err != nil {
		p.s.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	key := fmt.Sprint(tenant)
	ids, steps := make([]string, n), make([]int, n)
	for i := range n {
		ids[i], steps[i] = uuid.NewString(), p.next(tenant)
		agg := fmt.Sprintf("t%d-a%d", tenant, rand.IntN(4))
		payload := fmt.Sprintf(`{"aggregate":%q,"step":%d}`, key, steps[i])
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, tenant_id)
			VALUES ($1, 'order', $2, 'step', $3, $4)`, ids[i], agg, payload, tenant); err != nil {
			p.s.t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		p.s.t.Fatal(err)
	}
	for i := range n {
		p.s.wire.Written(ids[i], key, steps[i])
	}
	return n
}

func (p *tenantProducer) next(tenant int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.steps[tenant]++
	return p.steps[tenant]
}

// execDSN runs sql on the database at dsn.
func execDSN(t *testing.T, dsn, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// TestOrderByRefused checks outbox.order_by's errors: naming another
// contract column is a config error (exit 2), a column the table lacks
// fails check and run (exit 1) naming it and the table, and a relay whose
// order_by differs from a running relay's on the same outbox exits 1
// naming both while the first keeps running.
func TestOrderByRefused(t *testing.T) {
	t.Parallel()
	dsn := testenv.NewDB(t)
	execDSN(t, dsn, testenv.ContractOutbox)
	base := fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: webhook\n  webhook:\n    url: http://127.0.0.1:1/x\n", dsn)
	bad := writeConfig(t, base+"outbox:\n  order_by: event_type\n")
	if out, code := runRelay(t, "check", "--config", bad); code != 2 || !strings.Contains(out, "outbox.order_by") || !strings.Contains(out, "relay.yaml:10: outbox.order_by: names the event_type column") {
		t.Errorf("order_by naming event_type: exit %d, want 2 naming the key and its line\n%s", code, out)
	}
	missing := writeConfig(t, base+orderByYAML)
	want := `outbox table public.outbox has no column "tenant_id", which outbox.order_by names`
	for _, cmd := range []string{"check", "run"} {
		if out, code := runRelay(t, cmd, "--config", missing); code != 1 || !strings.Contains(out, want) {
			t.Errorf("relay %s on a table without tenant_id: exit %d, want 1 with %q\n%s", cmd, code, want, out)
		}
	}
}

// TestOrderByMixedRelaysRefused starts a poll relay with order_by
// tenant_id, then one with the default order: it must exit 1 naming both,
// since the two would partition the rows differently.
func TestOrderByMixedRelaysRefused(t *testing.T) {
	t.Parallel()
	s := newTenantStack(t, "poll")
	first := s.start()
	tp := newTenantProducer(s, 3)
	tp.produce(9, 3)
	s.waitDrained(30 * time.Second)
	cfg, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	plain := strings.Replace(string(cfg), orderByYAML, "", 1)
	out, code := runRelay(t, "run", "--config", writeConfig(t, plain))
	want := "another relay runs on outbox public.outbox with capture.mode poll and capture.poll.partitions 16 and another outbox.order_by, " +
		"this one with capture.mode poll and capture.poll.partitions 16 and the default outbox.order_by"
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("relay with the default order_by: exit %d, want 1 with %q\n%s", code, want, out)
	}
	tp.produce(9, 3)
	s.waitDrained(30 * time.Second)
	if code := first.stop(t, 15*time.Second); code != 0 {
		t.Errorf("the first relay exited %d", code)
	}
	s.verify()
}

// TestOrderByDeadLetterColumn sets outbox.order_by on an installation
// whose dead-letter table predates it: relay run exits 1 naming the
// ALTER TABLE, and relay init adds the column with the outbox column's
// type, after which relay run starts.
func TestOrderByDeadLetterColumn(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	if _, err := s.pool.Exec(context.Background(), `ALTER TABLE outbox ADD COLUMN tenant_id bigint`); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.cfgPath, append(cfg, orderByYAML...), 0o600); err != nil {
		t.Fatal(err)
	}
	want := `public.outbox_dead_letter has no column "tenant_id", which outbox.order_by names and dead letters and archived rows keep: ` +
		"run `relay init`, or ALTER TABLE \"public\".\"outbox_dead_letter\" ADD COLUMN IF NOT EXISTS \"tenant_id\" bigint"
	if out, code := runRelay(t, "run", "--config", s.cfgPath); code != 1 || !strings.Contains(out, want) {
		t.Fatalf("relay run: exit %d, want 1 with %q\n%s", code, want, out)
	}
	if out, code := runRelay(t, "init", "--config", s.cfgPath); code != 0 {
		t.Fatalf("relay init: exit %d\n%s", code, out)
	}
	var typ string
	if err := s.pool.QueryRow(context.Background(), `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'outbox_dead_letter'::regclass AND attname = 'tenant_id'`).Scan(&typ); err != nil || typ != "bigint" {
		t.Fatalf("dead-letter tenant_id: %q, %v; want bigint", typ, err)
	}
	relay := s.start()
	waitFor(t, func() bool { return strings.Contains(relay.logs.String(), "relay running") })
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

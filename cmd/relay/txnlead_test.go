package main

import (
	"context"
	"hash/fnv"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/capture/table"
)

// TestKafkaTransactionalPollReplicas runs two poll relays on one outbox
// with sink.kafka.transactional, as the helm chart's two replicas do: the
// first publishes, the second starts, and the outbox still drains (one
// relay captures, the other stands by rather than taking half of the
// partitions and fencing the first, whose half would stall), and again
// after the first relay is killed. A read_committed consumer sees every event
// once, in per-aggregate order.
func TestKafkaTransactionalPollReplicas(t *testing.T) {
	t.Parallel()
	c, yaml, _ := startKafkaCluster(t)
	s := newStack(t, stackOptions{Mode: "poll", Sink: yaml + "    transactional: true\n", Collect: readCommitted(c)})
	ctx := context.Background()
	a := s.start()
	s.produce(ctx, 300, 120, 4)
	s.waitDrained(90 * time.Second)
	b := s.start()
	waitFor(t, func() bool { return s.advisoryHolders() >= 2 }) // b's lease connection is up
	time.Sleep(3 * time.Second)                                 // a few rebalances, not an assertion
	s.produce(ctx, 1200, 120, 4)
	s.waitDrained(90 * time.Second)
	for _, p := range []*relayProc{a, b} {
		select {
		case <-p.done:
			t.Fatalf("a relay exited: %v", p.err)
		default:
		}
	}
	a.kill()
	s.produce(ctx, 600, 120, 4)
	s.waitDrained(90 * time.Second)
	if code := b.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if wire, _ := s.verify(); wire.Duplicates != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates", wire.Duplicates)
	}
}

// TestKafkaTransactionalWalLeadsAgain is the wal A/B/A failover with
// sink.kafka.transactional: relay A leads and publishes; A is frozen and
// loses its lock and its stream; relay B leads, fences A's producer and
// publishes; B is killed; A runs again, leads again and publishes what
// was written since. A read_committed consumer sees every event once.
func TestKafkaTransactionalWalLeadsAgain(t *testing.T) {
	t.Parallel()
	c, yaml, _ := startKafkaCluster(t)
	s := newStack(t, stackOptions{Mode: "wal", Sink: yaml + "    transactional: true\n", Collect: readCommitted(c)})
	ctx := context.Background()
	a := s.start()
	s.produce(ctx, 300, 30, 2)
	s.waitDrained(90 * time.Second)

	b := s.start()
	a.cmd.Process.Signal(syscall.SIGSTOP)
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	s.dropWalLeader()
	s.produce(ctx, 300, 30, 2)
	s.waitDrained(90 * time.Second)
	b.kill()

	a.cmd.Process.Signal(syscall.SIGCONT)
	s.produce(ctx, 300, 30, 2)
	s.waitDrained(90 * time.Second)
	if code := a.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if wire, _ := s.verify(); wire.Duplicates != 0 {
		t.Errorf("a read_committed consumer saw %d duplicates", wire.Duplicates)
	}
}

// dropWalLeader ends the sessions of the wal leader's lock and of its
// replication stream, as a network partition would: another relay can
// then lead.
func (s *stack) dropWalLeader() {
	s.t.Helper()
	h := fnv.New32a()
	h.Write([]byte("outbox-relay:wal:" + table.ParseName("outbox").String()))
	key := int32(h.Sum32() & 0x7fffffff)
	_, err := s.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = $1::int::oid AND objid = 0
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		UNION ALL SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active AND database = current_database()`, key)
	if err != nil {
		s.t.Fatal(err)
	}
}

// advisoryHolders returns how many sessions hold an advisory lock in the
// stack's database: a poll relay's lease connection holds one once it is up,
// whether it captures or stands by.
func (s *stack) advisoryHolders() int {
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory'
		AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

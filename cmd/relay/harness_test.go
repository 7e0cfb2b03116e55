package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// slotCounter makes replication slot names unique in the cluster the
// package's tests share.
var slotCounter atomic.Int64

// relayBin is the relay binary built once for the package's tests.
var relayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "relay-bin-")
	if err != nil {
		panic(err)
	}
	relayBin = filepath.Join(dir, "relay")
	if out, err := exec.Command("go", "build", "-o", relayBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build relay: %v\n%s", err, out)
		os.Exit(1)
	}
	testenv.OnExit(func() { os.RemoveAll(dir) })
	// The SQS emulator's credentials, for every relay the tests start: set
	// once here, since parallel tests cannot set the environment.
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"} {
		os.Setenv(k, v)
	}
	startPubSubFake()
	flag.Parse()
	bootRabbitEarly()
	testenv.Main(m)
}

// Top-level tests whose servers are their own (NATS, Kafka, SQS, receivers,
// extra PostgreSQL clusters) besides a database of the shared cluster, and
// whose assertions are not about timing, call t.Parallel: most of their time
// is spent waiting on those servers and on relay processes. go test runs
// them together after the others. Their subtests (one per capture mode,
// sink or PostgreSQL version) run in parallel too, each on servers and a
// database of its own, so that no long test runs its cases one after the
// other at the end of the package's run.

// roleCounter makes the names of the roles tests create unique in the
// package's cluster.
var roleCounter atomic.Int64

// stack is one database, one NATS server and a relay config pointing at
// them, with the logs of what producers wrote and consumers received.
type stack struct {
	t       *testing.T
	dsn     string
	nats    *testenv.NATS
	cfgPath string
	pool    *pgxpool.Pool
	wire    *verify.Log // every message seen on the subjects (core NATS)
	stream  *verify.Log // what the JetStream stream holds
	mu      sync.Mutex
	steps   map[int]int              // aggregate -> last step written
	archive string                   // archive.mode
	collect func() []verify.Delivery // see stackOptions.Collect
	role    string                   // the relay's role, when not the superuser (stackOptions.LeastPrivilege)
	// wireGaps is set by tests that stop the broker: the core subscriber
	// misses what is published while it reconnects, so only the stream
	// counts.
	wireGaps bool
	// messages: producers emit outbox messages (stackOptions.Messages).
	messages bool
}

// stackOptions vary a stack. Zero values take the defaults given.
type stackOptions struct {
	// DSN is the database; default a fresh one in the package's cluster.
	DSN string
	// Mode is the capture mode; default poll.
	Mode string
	// Extra is YAML appended to the config (top-level keys).
	Extra string
	// Archive is archive.mode; default delete. With partition (wal mode)
	// the ring is ringPartitions partitions of ringRows rows, so that a few
	// thousand events wrap it.
	Archive string
	// Sink is the config's sink block; default NATS JetStream on the
	// stack's server. With another sink, Collect must be set.
	Sink string
	// NoInit skips `relay init`: the outbox is created by hand as in
	// docs/reference.md, and `relay run` must create everything else itself.
	NoInit bool
	// Collect returns every delivery the sink's consumer has seen so far,
	// in delivery order; it replaces the NATS subscriber and stream reader.
	Collect func() []verify.Delivery
	// LeastPrivilege runs `relay run` as a role created for the test that
	// owns nothing and may create nothing, with exactly the grants `relay
	// init --dry-run --role` prints (see stack.restrict).
	LeastPrivilege bool
	// NATS tunes the stack's NATS server, e.g. its max_payload.
	NATS testenv.NATSOptions
	// Messages selects the table-free outbox (wal mode, capture.wal.source
	// messages): producers emit logical decoding messages instead of
	// inserting rows, and there is no outbox table.
	Messages bool
}

// newStack starts NATS, writes a config and runs `relay init`.
func newStack(t *testing.T, opts ...stackOptions) *stack {
	t.Helper()
	o := stackOptions{Mode: "poll"}
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.DSN == "" {
		o.DSN = testenv.NewDB(t)
	}
	if o.Mode == "" {
		o.Mode = "poll"
	}
	n, err := testenv.StartNATS(o.NATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	s := &stack{t: t, dsn: o.DSN, nats: n, wire: verify.NewLog(), stream: verify.NewLog(), steps: map[int]int{},
		archive: o.Archive, collect: o.Collect, messages: o.Messages}
	walSource := ""
	if o.Messages {
		o.Mode, walSource = "wal", "    source: messages\n"
	}
	if o.Sink == "" {
		o.Sink = fmt.Sprintf("sink:\n  type: nats\n  nats:\n    url: %s\n", n.URL())
	}
	if o.Archive != "" {
		o.Extra += "archive:\n  mode: " + o.Archive + "\n"
	}
	if o.Archive == "partition" {
		o.Extra += fmt.Sprintf("  partitions: %d\n  partition_rows: %d\n", ringPartitions, ringRows)
	}
	s.cfgPath = writeConfig(t, fmt.Sprintf(`postgres:
  url: %s
capture:
  mode: %s
  poll:
    interval: 50ms
  wal:
    slot: relay_test_%d
%s%sshutdown_timeout: 10s
%s`, s.dsn, o.Mode, slotCounter.Add(1), walSource, o.Sink, o.Extra))
	if s.pool, err = pgxpool.New(context.Background(), s.dsn); err != nil {
		t.Fatal(err)
	}
	if o.NoInit {
		if _, err := s.pool.Exec(context.Background(), testenv.ContractOutbox); err != nil {
			t.Fatal(err)
		}
	} else {
		s.init()
	}
	t.Cleanup(s.pool.Close)
	if o.LeastPrivilege {
		s.restrict()
	}
	if s.collect == nil {
		s.subscribe()
	}
	return s
}

// restrict creates a role with newRole, applies the GRANT statements
// `relay init --dry-run --role` prints for it, nothing else, and points the
// config at that role. The stack's own pool stays the superuser's.
func (s *stack) restrict() {
	s.t.Helper()
	var dsn string
	s.role, dsn = newRole(s.t, s.pool, s.dsn)
	s.grant()
	rewriteDSN(s.t, s.cfgPath, s.dsn, dsn)
}

// newRole creates, through the superuser's q, a LOGIN role that owns
// nothing and holds no privilege (CREATE on schema public is taken from
// PUBLIC explicitly, as PostgreSQL 15 does by default), and returns its
// name and dsn with the role as user.
func newRole(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, dsn string) (string, string) {
	t.Helper()
	role := fmt.Sprintf("relay_run_%d", roleCounter.Add(1))
	if _, err := q.Exec(context.Background(), fmt.Sprintf(`CREATE ROLE %s LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC`, role)); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return role, u.String()
}

// grant applies, as the superuser, the statements `relay init --dry-run
// --role` prints for the stack's role with the current config.
func (s *stack) grant() {
	s.t.Helper()
	out, code := runRelay(s.t, "init", "--dry-run", "--role", s.role, "--config", s.cfgPath)
	_, grants, ok := strings.Cut(out, "-- Privileges of role "+s.role)
	if code != 0 || !ok {
		s.t.Fatalf("relay init --dry-run --role: exit %d\n%s", code, out)
	}
	if _, err := s.pool.Exec(context.Background(), "--"+grants); err != nil {
		s.t.Fatalf("apply the printed grants: %v\n%s", err, grants)
	}
}

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// init runs relay init on the stack's database. A statement that gave up
// waiting for a lock is run again, as the message tells an operator to:
// on a loaded machine CREATE PUBLICATION once waited 5 s for a lock on the
// fresh outbox table in a clean-clone CI run; the holders are logged.
func (s *stack) init() {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		out, code := runRelay(s.t, "init", "--config", s.cfgPath)
		if code == 0 {
			return
		}
		if attempt == 3 || !strings.Contains(out, "gave up after lock_timeout") {
			s.t.Fatalf("relay init: exit %d\n%s", code, out)
		}
		s.t.Logf("relay init gave up waiting for a lock (attempt %d); holders: %s", attempt, s.lockHolders())
	}
}

// lockHolders describes the sessions holding locks on tables of the
// stack's database.
func (s *stack) lockHolders() string {
	var desc string
	err := s.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('pid %s %s on %s (%s: %s)',
		l.pid, l.mode, l.relation::regclass, a.backend_type, left(a.query, 120)), '; '), 'none')
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.pid <> pg_backend_pid()`).Scan(&desc)
	if err != nil {
		return err.Error()
	}
	return desc
}

// runRelay runs a relay command to completion and returns its combined
// output and exit status.
func runRelay(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, relayBin, args...).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("relay %v: %v", args, err)
	}
	return string(out), 0
}

// relayProc is a `relay run` child process.
type relayProc struct {
	cmd  *exec.Cmd
	logs bytes.Buffer
	done chan struct{}
	err  error
}

// start launches `relay run` on the stack's config.
func (s *stack) start() *relayProc {
	s.t.Helper()
	return startProc(s.t, context.Background(), "run", "--config", s.cfgPath)
}

// startProc starts the relay binary with args; it is killed when the test
// ends, and its log is printed if the test failed.
func startProc(t *testing.T, ctx context.Context, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{cmd: exec.CommandContext(ctx, relayBin, args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("relay log:\n%s", p.logs.String())
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to end.
func (p *relayProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and returns the exit status, failing after d.
func (p *relayProc) stop(t *testing.T, d time.Duration) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("relay did not exit within %s of SIGTERM", d)
	}
	return p.cmd.ProcessState.ExitCode()
}

// produce writes events over aggregates from producers goroutines, each
// owning its aggregates and committing 1–3 events per transaction in step
// order. It returns when all are written or ctx ends.
func (s *stack) produce(ctx context.Context, events, aggregates, producers int) {
	var wg sync.WaitGroup
	per := events / producers
	for p := range producers {
		wg.Go(func() { s.producer(ctx, p, producers, per, aggregates) })
	}
	wg.Wait()
}

func (s *stack) producer(ctx context.Context, p, producers, events, aggregates int) {
	for written := 0; written < events && ctx.Err() == nil; {
		agg := p + producers*rand.IntN(aggregates/producers)
		n, err := s.write(ctx, agg, min(1+rand.IntN(3), events-written))
		written += n
		if err != nil {
			time.Sleep(50 * time.Millisecond) // the database may be restarting
		}
	}
}

// write commits n events of aggregate agg in one transaction and records
// them; it returns how many were committed.
func (s *stack) write(ctx context.Context, agg, n int) (int, error) {
	return s.writeAs(ctx, agg, n, "step")
}

// writeAs is write with the events' event_type.
func (s *stack) writeAs(ctx context.Context, agg, n int, eventType string) (int, error) {
	name := fmt.Sprintf("order-%d", agg)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	ids, steps := make([]string, n), make([]int, n)
	for i := range n {
		ids[i], steps[i] = uuid.NewString(), s.nextStep(agg)
		payload := fmt.Sprintf(`{"aggregate":%q,"step":%d}`, name, steps[i])
		if _, err := tx.Exec(ctx, s.writeSQL(), ids[i], name, payload, eventType); err != nil {
			return 0, err
		}
	}
	record := func(l *verify.Log, id string, step int) { l.Written(id, name, step) }
	err = tx.Commit(ctx)
	if err != nil {
		record = func(l *verify.Log, id string, step int) { l.MaybeWritten(id, name, step) }
	}
	for i := range n {
		record(s.wire, ids[i], steps[i])
		record(s.stream, ids[i], steps[i])
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// writeSQL returns the statement writing one event: $1 its id, $2 the
// aggregate id, $3 the payload, $4 the event type. With the table-free
// outbox it is the emit statement of docs/reference.md.
func (s *stack) writeSQL() string {
	if s.messages {
		return `SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', $1::uuid, 'aggregate_type', 'order',
			'aggregate_id', $2::text, 'event_type', $4::text, 'payload', $3::jsonb, 'headers', '{"trace":"t"}'::jsonb)::text)`
	}
	return `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, 'order', $2, $4, $3, '{"trace":"t"}')`
}

// nextStep returns the next step number of aggregate agg; steps continue
// across produce calls.
func (s *stack) nextStep(agg int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps[agg]++
	return s.steps[agg]
}

// subscribe records every message published on the stream's subjects with
// a core NATS subscription, which also sees what JetStream deduplicates.
func (s *stack) subscribe() {
	nc, err := nats.Connect(s.nats.URL())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(nc.Close)
	sub, err := nc.Subscribe("outbox.>", func(m *nats.Msg) { s.wire.Delivered(delivery(m.Header, m.Data)) })
	if err != nil {
		s.t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	nc.Flush()
}

// delivery decodes one message into a verify.Delivery, checking its
// headers against its payload.
func delivery(h nats.Header, data []byte) verify.Delivery {
	var body struct {
		Aggregate string
		Step      int
	}
	d := verify.Delivery{MessageID: h.Get("message_id"), AggregateID: h.Get("aggregate_id")}
	if err := json.Unmarshal(data, &body); err != nil {
		d.Problem = "payload: " + err.Error()
	}
	d.Step = body.Step
	switch {
	case h.Get("Nats-Msg-Id") != d.MessageID:
		d.Problem = "Nats-Msg-Id " + h.Get("Nats-Msg-Id") + " differs from message_id"
	case body.Aggregate != d.AggregateID:
		d.Problem = "aggregate_id header " + d.AggregateID + " differs from the payload's " + body.Aggregate
	case h.Get("event_type") != "step" || h.Get("aggregate_type") != "order" || h.Get("trace") != "t":
		d.Problem = fmt.Sprintf("headers %v", h)
	}
	return d
}

// readStream records the stream's messages in stream order.
func (s *stack) readStream() {
	s.t.Helper()
	for _, d := range streamDeliveries(s.t, s.nats.URL()) {
		s.stream.Delivered(d)
	}
}

// streamDeliveries returns the messages the stream OUTBOX on the NATS
// server at url holds, in stream order. opts are the connection's
// credentials and TLS settings, if any.
func streamDeliveries(t *testing.T, url string, opts ...nats.Option) []verify.Delivery {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, "OUTBOX")
	if err != nil {
		t.Fatal(err)
	}
	info, _ := st.Info(ctx)
	// The read deletes its consumer at the end, so that tests that poll the
	// stream do not pile consumers up; the server drops one a failed read
	// left a minute after. (A threshold of 2s let the server drop, under
	// load, a consumer the fetch had just created before its pull request
	// came: "no responders available for request".)
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{InactiveThreshold: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			st.DeleteConsumer(context.Background(), info.Name)
		}
	}()
	// Each fetch asks for messages the stream already holds, so it returns
	// as soon as they arrive and a long wait costs nothing: a wait of one
	// second ran out under load before a 20 MiB message
	// (TestBigTransactionMemory) arrived, and the next fetch started over.
	// Waits of 10s and more make the server send heartbeats, whose late
	// arrival under load failed the read ("no heartbeat received").
	var ds []verify.Delivery
	for left := int(info.State.Msgs); left > 0; {
		if ctx.Err() != nil {
			t.Fatalf("read stream: %d messages not received", left)
		}
		batch, err := c.Fetch(min(left, 1000), jetstream.FetchMaxWait(9*time.Second))
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		for m := range batch.Messages() {
			ds = append(ds, delivery(m.Headers(), m.Data()))
			left--
		}
		if err := batch.Error(); err != nil {
			t.Fatalf("read stream: %v", err)
		}
	}
	return ds
}

// rewriteDSN points the relay's config at another address of the database.
func rewriteDSN(t *testing.T, path, from, to string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), from, to, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// outboxRows counts the rows left in the outbox (unpublished ones in
// archive mode mark); 0 with the table-free outbox, and in archive mode
// partition, whose ring holds published rows until it truncates them (only
// the wire tells what is published).
func (s *stack) outboxRows() int {
	if s.messages || s.archive == "partition" {
		return 0
	}
	q := `SELECT count(*) FROM outbox`
	if s.archive == "mark" {
		q += ` WHERE published_at IS NULL`
	}
	var n int
	var err error
	// A test that restarted Postgres leaves the pool connections the
	// restart ended; the pool drops each on its first error.
	for range 3 {
		if err = s.pool.QueryRow(context.Background(), q).Scan(&n); err == nil {
			return n
		}
	}
	s.t.Fatal(err)
	return 0
}

// syncWire takes the deliveries of a sink other than NATS into the wire
// log.
func (s *stack) syncWire() {
	if s.collect != nil {
		s.wire.ReplaceDeliveries(s.collect())
	}
}

// waitPublishing waits until the relay delivered its first event, so that
// faults injected afterwards hit a running relay, not its start-up (where a
// database it cannot reach makes it wait, not ready).
func (s *stack) waitPublishing() {
	s.t.Helper()
	waitFor(s.t, func() bool { s.syncWire(); return s.wire.Deliveries() > 0 })
}

// waitDrained waits until every written event is on the wire and the
// outbox is empty.
func (s *stack) waitDrained(d time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		s.syncWire()
		r := s.wire.Check()
		if (s.wireGaps || len(r.Missing) == 0) && s.outboxRows() == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("not drained after %s: %s, outbox rows %d", d, s.wire.Check(), s.outboxRows())
}

// verify checks both logs and fails the test on any broken guarantee.
func (s *stack) verify() (wire, stream verify.Report) {
	s.t.Helper()
	if s.collect != nil {
		s.syncWire()
		wire = s.wire.Check()
		if err := wire.Err(); err != nil {
			s.t.Errorf("delivered: %v", err)
		}
		if n := s.outboxRows(); n != 0 {
			s.t.Errorf("%d rows left in the outbox", n)
		}
		return wire, wire
	}
	s.readStream()
	wire, stream = s.wire.Check(), s.stream.Check()
	if err := wire.Err(); err != nil && !s.wireGaps {
		s.t.Errorf("on the wire: %v", err)
	}
	if err := stream.Err(); err != nil {
		s.t.Errorf("in the stream: %v", err)
	}
	if stream.Duplicates > 0 {
		s.t.Errorf("the stream holds %d duplicates despite Nats-Msg-Id", stream.Duplicates)
	}
	if n := s.outboxRows(); n != 0 {
		s.t.Errorf("%d rows left in the outbox", n)
	}
	return wire, stream
}

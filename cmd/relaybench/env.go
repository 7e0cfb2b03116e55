package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// pgSettings are the cluster's settings: durable commits (fsync, full page
// writes, synchronous_commit on, as in production), enough memory to keep a
// 1M-row outbox cached, and no checkpoint during a phase.
var pgSettings = map[string]string{
	"fsync":                       "on",
	"full_page_writes":            "on",
	"synchronous_commit":          "on",
	"wal_level":                   "logical",
	"shared_buffers":              "512MB",
	"max_wal_size":                "16GB",
	"min_wal_size":                "1GB",
	"checkpoint_timeout":          "30min",
	"wal_buffers":                 "16MB",
	"logical_decoding_work_mem":   "256MB",
	"max_connections":             "300",
	"autovacuum_naptime":          "10s",
	"maintenance_work_mem":        "256MB",
	"wal_sender_timeout":          "5min",
	"log_min_messages":            "warning",
	"log_checkpoints":             "off",
	"log_autovacuum_min_duration": "-1",
}

// benchStream and benchSubject are what the relay publishes to.
const (
	benchStream  = "BENCH"
	benchSubject = "bench.{aggregate_type}"
	// pubsubProject and pubsubTopic are where Pub/Sub drains publish: a
	// fixed topic, which relay init creates in pstest.
	pubsubProject = "relaybench"
	pubsubTopic   = "bench-events"
	benchFilter   = "bench.>"
	aggType       = "order"
	// benchPartitionRows is archive.partition_rows of the partition relay's
	// config: small enough that a run of the impact phase truncates
	// partitions.
	benchPartitionRows = 10_000
	// benchPublication is capture.wal.publication of the relay configs.
	benchPublication = "relay_bench"
)

// env is the servers and the relay binary of one bench run.
type env struct {
	opts     Options
	pg       *testenv.Postgres
	nats     *testenv.NATS
	nc       *nats.Conn
	js       jetstream.JetStream
	relayBin string
	prevBin  string // the previous release's relay (-impact-previous), built by the impact phase
	pgBin    string
	kafka    *kafkatest.Cluster // kfake, started on first use
	rabbit   *testenv.RabbitMQ  // started on first use
	pubsub   *pstest.Server     // Google's Pub/Sub fake, started on first use
	dir      string             // temporary directory: relay binary, configs, logs
	closers  []func()
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startEnv builds the relay and starts PostgreSQL and NATS.
func startEnv(ctx context.Context, opts Options) (*env, error) {
	e := &env{opts: opts}
	var err error
	if e.dir, err = os.MkdirTemp("", "relaybench-"); err != nil {
		return nil, err
	}
	e.closers = append(e.closers, func() { os.RemoveAll(e.dir) })
	if err := e.buildRelay(ctx); err != nil {
		e.close()
		return nil, err
	}
	if e.pgBin, err = postgresBin(); err != nil {
		e.close()
		return nil, err
	}
	e.pg, err = testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: pgSettings})
	if err != nil {
		e.close()
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	e.closers = append(e.closers, func() { _ = e.pg.Stop() })
	setPostmaster(e.pg)
	if e.nats, err = testenv.StartNATS(testenv.NATSOptions{}); err != nil {
		e.close()
		return nil, fmt.Errorf("start NATS: %w", err)
	}
	e.closers = append(e.closers, e.nats.Shutdown)
	if e.nc, err = nats.Connect(e.nats.URL(), nats.Name("relaybench")); err != nil {
		e.close()
		return nil, err
	}
	e.closers = append(e.closers, e.nc.Close)
	if e.js, err = jetstream.New(e.nc); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// buildRelay builds cmd/relay into the temporary directory, unless a binary
// was given.
func (e *env) buildRelay(ctx context.Context) error {
	if e.opts.RelayBin != "" {
		e.relayBin = e.opts.RelayBin
		return nil
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	e.relayBin = filepath.Join(e.dir, "relay")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", e.relayBin, "./cmd/relay")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/relay: %w\n%s", err, out)
	}
	return nil
}

// buildPrevious builds cmd/relay as of git revision rev into the
// temporary directory, from a detached worktree of the module's
// repository that it removes afterwards, and returns the binary's path.
func (e *env) buildPrevious(ctx context.Context, rev string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	src, bin := filepath.Join(e.dir, "previous-src"), filepath.Join(e.dir, "relay-previous")
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "worktree", "add", "--detach", src, rev).CombinedOutput(); err != nil {
		return "", fmt.Errorf("git worktree add %s: %w\n%s", rev, err, out)
	}
	defer exec.Command("git", "-C", root, "worktree", "remove", "--force", src).Run()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/relay")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/relay at %s: %w\n%s", rev, err, out)
	}
	return bin, nil
}

// moduleRoot finds the directory of go.mod from the working directory up.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run relaybench inside the relay module (go run ./cmd/relaybench)")
	}
	return filepath.Dir(mod), nil
}

// postgresBin returns the directory of pg_recvlogical, as testenv finds
// the server binaries: on PATH, else the newest /usr/lib/postgresql/*/bin.
func postgresBin() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(real), "pg_recvlogical")); err == nil {
				return filepath.Dir(real), nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[i])), 64)
		b, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dirs[j])), 64)
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_recvlogical")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("pg_recvlogical not found on PATH or in /usr/lib/postgresql/*/bin")
}

// database is one bench database with the relay config pointing at it.
type database struct {
	name    string
	dsn     string
	mode    string // capture mode of the relay config
	sink    string // nats or kafka
	brokers []string
	cfgPath string // the config `relay init` uses
	port    int    // its http.listen port
	dir     string
	natsURL string
	amqpURL string
	pool    *pgxpool.Pool

	pollInterval time.Duration
	pollLinger   time.Duration
	walLinger    time.Duration
	kafkaLinger  time.Duration
	batchSize    int
	notify       bool   // capture.poll.notify
	walSource    string // capture.wal.source; empty: the relay's default (table)
	archiveMode  string // archive.mode; empty: the relay's default (delete)
}

// slot is the relay's replication slot in wal mode: slots belong to the
// cluster, so each database needs its own name.
func (d *database) slot() string { return "relay_" + d.name }

// configCopy writes a relay config for d to <dir>/<tag>.yaml with a free
// http.listen port and returns its path and port.
func (d *database) configCopy(tag string) (string, int, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return "", 0, err
	}
	snk := fmt.Sprintf(`  type: nats
  nats:
    url: %q
    subject: %q
    stream: %s`, d.natsURL, benchSubject, benchStream)
	if d.sink == "pubsub" {
		snk = fmt.Sprintf(`  type: pubsub
  pubsub:
    project_id: %s
    topic: %s`, pubsubProject, pubsubTopic)
	}
	if d.sink == "kafka" {
		snk = fmt.Sprintf(`  type: kafka
  kafka:
    brokers: [%q]
    topic: %q`, strings.Join(d.brokers, `", "`), benchSubject)
		if d.kafkaLinger > 0 {
			snk += fmt.Sprintf("\n    linger: %s", d.kafkaLinger)
		}
	}
	if d.sink == "rabbitmq" {
		snk = fmt.Sprintf(`  type: rabbitmq
  rabbitmq:
    url: %q
    exchange: %s
    declare: true`, d.amqpURL, benchRabbitMQ)
	}
	poll := ""
	if d.pollInterval > 0 {
		poll += fmt.Sprintf("\n    interval: %s", d.pollInterval)
	}
	if d.pollLinger > 0 {
		poll += fmt.Sprintf("\n    linger: %s", d.pollLinger)
	}
	if d.batchSize > 0 {
		poll += fmt.Sprintf("\n    batch_size: %d", d.batchSize)
	}
	if d.notify {
		poll += "\n    notify: true"
	}
	if poll != "" {
		poll = "\n  poll:" + poll
	}
	wal := ""
	if d.walLinger > 0 {
		wal = fmt.Sprintf("\n    linger: %s", d.walLinger)
	}
	if d.walSource != "" {
		wal += "\n    source: " + d.walSource
	}
	archive := ""
	if d.archiveMode != "" {
		archive = "archive:\n  mode: " + d.archiveMode + "\n"
	}
	if d.archiveMode == "partition" {
		archive += fmt.Sprintf("  partition_rows: %d\n", benchPartitionRows)
	}
	cfg := fmt.Sprintf(`postgres:
  url: %q
capture:
  mode: %s%s
  wal:
    slot: %s
    publication: %s%s
sink:
%s
%shttp:
  listen: 127.0.0.1:%d
log:
  level: warn
shutdown_timeout: 10s
`, d.dsn, d.mode, poll, d.slot(), benchPublication, wal, snk, archive, port)
	path := filepath.Join(d.dir, tag+".yaml")
	return path, port, os.WriteFile(path, []byte(cfg), 0o600)
}

// newDatabase creates database name and writes a relay config for it,
// publishing to NATS.
func (e *env) newDatabase(ctx context.Context, name, mode string) (*database, error) {
	return e.newSinkDatabase(ctx, name, mode, "nats")
}

// newSinkDatabase creates database name and writes a relay config for it
// with sink snk (nats, or kafka on the kfake broker).
func (e *env) newSinkDatabase(ctx context.Context, name, mode, snk string) (*database, error) {
	dsn, err := e.pg.CreateDatabase(ctx, name)
	if err != nil {
		return nil, err
	}
	d := &database{name: name, dsn: dsn, mode: mode, sink: snk, dir: e.dir, natsURL: e.nats.URL(),
		pollInterval: e.opts.PollInterval, pollLinger: e.opts.PollLinger,
		walLinger: e.opts.WalLinger, kafkaLinger: e.opts.KafkaLinger, batchSize: e.opts.BatchSize, notify: e.opts.PollNotify && mode == "poll"}
	if snk == "kafka" {
		if err := e.startKafka(); err != nil {
			return nil, err
		}
		d.brokers = e.kafka.Addrs()
	}
	if snk == "rabbitmq" {
		if err := e.startRabbitMQ(); err != nil {
			return nil, err
		}
		d.amqpURL = e.rabbit.URL("guest", "guest")
	}
	if snk == "pubsub" {
		e.startPubSub()
	}
	if d.cfgPath, d.port, err = d.configCopy(name); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(max(e.opts.Writers, slices.Max(writerSweep)) + 4)
	pcfg.ConnConfig.RuntimeParams["application_name"] = "relaybench"
	if d.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, err
	}
	return d, nil
}

// drop closes the pool and drops the database with its slots.
func (e *env) dropDatabase(d *database) {
	d.pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.pg.DropDatabase(ctx, d.name); err != nil {
		e.opts.logf("drop database %s: %v", d.name, err)
	}
}

// relayCmd runs a relay command to completion and returns its output.
func (e *env) relayCmd(ctx context.Context, args ...string) (string, error) {
	return e.relayCmdOf(ctx, e.relayBin, args...)
}

// relayCmdOf runs a command of relay binary bin to completion and returns
// its output.
func (e *env) relayCmdOf(ctx context.Context, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("relay %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// errNotAvailable marks a mode this relay build rejects as not implemented.
var errNotAvailable = errors.New("not available yet")

// initRelay runs `relay init` for d. A config this build rejects as not
// implemented yields an error wrapping errNotAvailable.
func (e *env) initRelay(ctx context.Context, d *database) error {
	return e.initWith(ctx, e.relayBin, d)
}

// initWith is initRelay with relay binary bin.
func (e *env) initWith(ctx context.Context, bin string, d *database) error {
	out, err := e.relayCmdOf(ctx, bin, "init", "--config", d.cfgPath)
	if err != nil && strings.Contains(out, "not implemented") {
		return fmt.Errorf("%w: %s", errNotAvailable, firstLine(out))
	}
	return err
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// startPubSub starts pstest, Google's in-process Pub/Sub fake, once, and
// points the relays started afterwards at it through PUBSUB_EMULATOR_HOST
// (they inherit the bench's environment).
func (e *env) startPubSub() {
	if e.pubsub != nil {
		return
	}
	e.pubsub = pstest.NewServer()
	e.closers = append(e.closers, func() { e.pubsub.Close() })
	os.Setenv("PUBSUB_EMULATOR_HOST", e.pubsub.Addr)
}

// startKafka starts the in-process kfake broker once.
func (e *env) startKafka() error {
	if e.kafka != nil {
		return nil
	}
	k, err := kafkatest.Start(kafkatest.Options{DefaultPartitions: 3, CountProduce: true})
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	e.kafka = k
	e.closers = append(e.closers, k.Close)
	return nil
}

// benchRabbitMQ names the exchange and the quorum queue bound to it that
// `relay init` declares for the RabbitMQ drains.
const benchRabbitMQ = "bench"

// startRabbitMQ starts a RabbitMQ node once.
func (e *env) startRabbitMQ() error {
	if e.rabbit != nil {
		return nil
	}
	r, err := testenv.StartRabbitMQ(testenv.RabbitMQOptions{})
	if err != nil {
		return err
	}
	e.rabbit = r
	e.closers = append(e.closers, r.Shutdown)
	return nil
}

// rabbitMessages returns how many messages the bench queue holds.
func (e *env) rabbitMessages() (uint64, error) {
	c, err := amqp.Dial(e.rabbit.URL("guest", "guest"))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(benchRabbitMQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return 0, err
	}
	return uint64(q.Messages), nil
}

// produceRequests returns how many produce requests kfake received so
// far, 0 when it does not run.
func (e *env) produceRequests() int64 {
	if e.kafka == nil {
		return 0
	}
	return e.kafka.ProduceRequests()
}

// kafkaRecords returns the sum of the end offsets of the bench topics:
// how many records were produced to them.
func (e *env) kafkaRecords(ctx context.Context) (uint64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Addrs()...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return 0, err
	}
	var names []string
	for _, n := range topics.Names() {
		if strings.HasPrefix(n, "bench.") {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return 0, nil
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return 0, err
	}
	var total uint64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			total += uint64(o.Offset)
		}
	})
	return total, nil
}

// sinkCount returns how many messages the sink of d holds.
func (e *env) sinkCount(ctx context.Context, d *database) (uint64, error) {
	switch d.sink {
	case "kafka":
		return e.kafkaRecords(ctx)
	case "rabbitmq":
		return e.rabbitMessages()
	case "pubsub":
		return uint64(len(e.pubsub.Messages())), nil
	}
	return e.streamMsgs(ctx)
}

// deleteStream removes the bench stream so that the next relay run starts
// from an empty one (`relay run` creates it).
func (e *env) deleteStream(ctx context.Context) {
	err := e.js.DeleteStream(ctx, benchStream)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		e.opts.logf("delete stream: %v", err)
	}
}

// streamMsgs returns how many messages the bench stream holds.
func (e *env) streamMsgs(ctx context.Context) (uint64, error) {
	s, err := e.js.Stream(ctx, benchStream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// relayProc is a `relay run` child process.
type relayProc struct {
	cmd     *exec.Cmd
	logPath string
	port    int
	started time.Time
	done    chan struct{}
	err     error
	http    *http.Client
}

// startRelay starts `relay run` on d's config; relay i > 0 gets a copy of
// the config with its own http.listen port.
func (e *env) startRelay(d *database, tag string) (*relayProc, error) {
	return e.startRelayBin(e.relayBin)(d, tag)
}

// startRelayBin returns a relayStarter running `relay run` of binary bin.
func (e *env) startRelayBin(bin string) relayStarter {
	return func(d *database, tag string) (*relayProc, error) {
		path, port, err := d.configCopy(tag)
		if err != nil {
			return nil, err
		}
		return e.startProc(tag, port, bin, "run", "--config", path)
	}
}

// relayGODEBUG is the GODEBUG the relay's container image sets (see the
// Dockerfile and docs/operations.md): the bench runs relays and floors with
// it, unless its own environment sets GODEBUG.
const relayGODEBUG = "schedtrace=2147483647"

// startProc starts bin with args as a relay whose HTTP endpoints listen on
// port, logging to <tag>.log.
func (e *env) startProc(tag string, port int, bin string, args ...string) (*relayProc, error) {
	logPath := filepath.Join(e.dir, tag+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &relayProc{logPath: logPath, port: port, done: make(chan struct{}),
		// Uncompressed: a gzip writer per scrape would be measured as relay CPU.
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableCompression: true}}}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.Env = os.Environ()
	if _, set := os.LookupEnv("GODEBUG"); !set {
		p.cmd.Env = append(p.cmd.Env, "GODEBUG="+relayGODEBUG)
	}
	if n := e.opts.RelayProcs; n > 0 {
		p.cmd.Env = append(p.cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", n))
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// alive reports whether the process still runs.
func (p *relayProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited returns an error with the log's tail when the relay has exited.
func (p *relayProc) exited() error {
	if p.alive() {
		return nil
	}
	return fmt.Errorf("relay exited (%v); log tail:\n%s", p.err, tail(p.logPath, 20))
}

// stop sends SIGTERM and waits up to 30s, then kills.
func (p *relayProc) stop() error {
	if !p.alive() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("relay did not stop within 30s of SIGTERM; killed")
	}
	return nil
}

// waitReady waits until /readyz answers 200.
func (p *relayProc) waitReady(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := p.exited(); err != nil {
			return err
		}
		resp, err := p.http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", p.port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("relay not ready after %s; log tail:\n%s", d, tail(p.logPath, 20))
}

// metrics scrapes /metrics and returns the relay_* and go_memstats_*
// samples without labels.
func (p *relayProc) metrics() (map[string]float64, error) {
	resp, err := p.http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.port))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "relay_") && !strings.HasPrefix(line, "go_memstats_") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			m[name] = v
		}
	}
	return m, sc.Err()
}

// procStats is what /proc says about a process.
type procStats struct {
	PeakRSSBytes int64   // VmHWM
	RSSBytes     int64   // VmRSS
	CPUSeconds   float64 // utime + stime
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on Linux.
const clockTicks = 100

func readProcStats(pid int) (procStats, error) {
	var s procStats
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmHWM":
			dst = &s.PeakRSSBytes
		case "VmRSS":
			dst = &s.RSSBytes
		default:
			continue
		}
		f := strings.Fields(v)
		if len(f) >= 1 {
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			*dst = kb * 1024
		}
	}
	u, st, _, _, err := statTimes(pid)
	s.CPUSeconds = float64(u+st) / clockTicks
	return s, err
}

// statTimes returns utime, stime, cutime and cstime of /proc/<pid>/stat in
// clock ticks.
func statTimes(pid any) (utime, stime, cutime, cstime int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%v/stat", pid))
	if err != nil {
		return 0, 0, 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, so f[11].
	if len(f) < 15 {
		return 0, 0, 0, 0, errors.New("short stat")
	}
	p := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	return p(f[11]), p(f[12]), p(f[13]), p(f[14]), nil
}

// cpuSample is a point-in-time reading of CPU use of the machine and of
// its parts, to show where the cores went during a phase.
type cpuSample struct {
	at       time.Time
	machine  [2]int64 // busy, total ticks from /proc/stat
	postgres int64    // ticks of postgres processes, with reaped children
	bench    int64    // this process and its reaped children (NATS server, load generator, consumer, pg_recvlogical)
	others   map[int]procTicks
}

// postmaster is the pid of the bench's own PostgreSQL server: other
// clusters on the machine (other workloads' tests) count as other CPU.
var postmaster atomic.Int64

// setPostmaster reads the server's pid from postmaster.pid in its data
// directory.
func setPostmaster(pg *testenv.Postgres) {
	b, err := os.ReadFile(filepath.Join(pg.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil {
		postmaster.Store(int64(pid))
	}
}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	pm := int(postmaster.Load())
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		var total, idle int64
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			if i >= 8 { // guest time is already in user
				break
			}
			total += n
			if i == 3 || i == 4 { // idle, iowait
				idle += n
			}
		}
		s.machine = [2]int64{total - idle, total}
	}
	self := os.Getpid()
	s.others = map[int]procTicks{}
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == self {
			continue
		}
		comm, ppid, own, children, err := procTimes(pid)
		switch {
		case err != nil, ppid == self: // the relay and pg_recvlogical are counted apart
		case comm == "postgres" && pm > 0 && (pid == pm || ppid == pm):
			s.postgres += own + children // the postmaster's children are its backends
		default:
			s.others[pid] = procTicks{comm, own}
		}
	}
	u, st, cu, cs, _ := statTimes("self")
	s.bench = u + st + cu + cs
	return s
}

type procTicks struct {
	comm  string
	ticks int64 // utime+stime: a parent's reaped children are not its own
}

// procTimes returns the command name, parent pid and CPU ticks of pid, its
// own and its reaped children's.
func procTimes(pid int) (comm string, ppid int, own, children int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, 0, 0, err
	}
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "", 0, 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 15 {
		return "", 0, 0, 0, errors.New("short stat")
	}
	p := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	return string(b[i+1 : j]), int(p(f[1])), p(f[11]) + p(f[12]), p(f[13]) + p(f[14]), nil
}

// topOthers returns the CPU seconds of the busiest other commands between
// two samples, at most n, by command name.
func topOthers(a, b cpuSample, n int) map[string]float64 {
	by := map[string]int64{}
	for pid, t := range b.others {
		d := t.ticks
		if o, ok := a.others[pid]; ok && o.comm == t.comm {
			d -= o.ticks
		}
		if d > 0 {
			by[t.comm] += d
		}
	}
	keys := sortedKeys(by)
	sort.Slice(keys, func(i, j int) bool { return by[keys[i]] > by[keys[j]] })
	out := map[string]float64{}
	for _, k := range keys[:min(n, len(keys))] {
		if by[k] >= clockTicks/10 {
			out[k] = float64(by[k]) / clockTicks
		}
	}
	return out
}

// cpuUse is what the cores did between two samples. The machine is
// shared: OtherSeconds is the CPU time of everything that is neither
// Postgres, the relay nor this process (other workloads, kernel threads),
// which tells whether a figure was measured on a quiet machine.
type cpuUse struct {
	Seconds            float64 `json:"wall_seconds"`
	MachineBusyPercent float64 `json:"machine_busy_percent"` // of all cores
	BusySeconds        float64 `json:"busy_cpu_seconds"`     // of all cores
	PostgresSeconds    float64 `json:"postgres_cpu_seconds"`
	RelaySeconds       float64 `json:"relay_cpu_seconds"`
	BenchSeconds       float64 `json:"bench_cpu_seconds"` // NATS server, load generator, consumer, scrapes, pg_recvlogical
	OtherSeconds       float64 `json:"other_cpu_seconds"`
	// TopOthers are the busiest other processes by command name (processes
	// that started and ended in between are missing).
	TopOthers map[string]float64 `json:"top_other_processes,omitempty"`
}

// cpuBetween returns the CPU use between a and b, of which relay seconds
// were the relay's.
func cpuBetween(a, b cpuSample, relay float64) cpuUse {
	u := cpuUse{Seconds: b.at.Sub(a.at).Seconds(), RelaySeconds: relay}
	if dt := b.machine[1] - a.machine[1]; dt > 0 {
		u.MachineBusyPercent = 100 * float64(b.machine[0]-a.machine[0]) / float64(dt)
	}
	u.BusySeconds = float64(b.machine[0]-a.machine[0]) / clockTicks
	u.PostgresSeconds = float64(b.postgres-a.postgres) / clockTicks
	u.BenchSeconds = float64(b.bench-a.bench) / clockTicks
	u.OtherSeconds = max(0, u.BusySeconds-u.PostgresSeconds-u.BenchSeconds-relay)
	u.TopOthers = topOthers(a, b, 6)
	return u
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pgVersion returns the server's version string.
func pgVersion(ctx context.Context, pool *pgxpool.Pool) string {
	var v string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v
}

// machineInfo describes where the bench ran.
type machineInfo struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryMB  int64  `json:"memory_mb"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go_version"`
	Postgres  string `json:"postgres_version"`
}

func describeMachine() machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) >= 2 {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			m.MemoryMB = kb / 1024
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// exec runs one statement in d.
func (d *database) exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.pool.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", firstLine(sql), err)
	}
	return nil
}

// currentLSN returns pg_current_wal_lsn() as text.
func (d *database) currentLSN(ctx context.Context) (string, error) {
	var lsn string
	err := d.pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}

// Command relaybench measures the relay against the database's own limits in
// one run on one machine: it starts a throwaway PostgreSQL cluster and an
// embedded NATS JetStream server, builds the relay and runs it as a child
// process (`relay run --config`), and measures
//
//   - backlog drain: N events inserted with the relay stopped, then drained
//     (events/s from relay start until every event is acknowledged and
//     archived), per capture mode;
//   - baselines from the same run: raw pgoutput decode of the same WAL with
//     pg_recvlogical, and a raw DELETE … RETURNING drain in batches of 1,000;
//   - steady state: open-loop single-row transactions at 25, 50 and 100 % of
//     the single-row commit rate measured first, with latency from the
//     intended send time to broker acknowledgement and to consumer receipt;
//   - cost: the relay's peak RSS and CPU seconds per 100,000 events;
//   - with -phases insert: what each outbox table variant (indexes, column
//     types, trigger, partitions) costs a single-row INSERT.
//
// It prints one table and writes every figure to a JSON file. See
// docs/benchmarks.md.
//
//	go run ./cmd/relaybench [-events N] [-aggregates N] [-payload BYTES]
//	    [-out results.json] [-modes poll,wal] [-quick] [-steady 15s]
//	    [-cpuprofile DIR] [-relay-gomaxprocs N] [-impact-sink nats|kafka] [-impact-rate N]
//	    [-impact-floors=false] [-insert-for 10s] [-insert-clients 8]
//	    [-insert-variants default,ring8]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Options are the bench's settings, from the command line.
type Options struct {
	Events      int           // backlog size of each drain
	Aggregates  int           // distinct aggregate_ids
	Payload     int           // payload size in bytes
	Out         string        // JSON results file; empty: none
	Modes       []string      // capture modes: poll, wal
	Sinks       []string      // sinks of the drains: nats, kafka (kfake), rabbitmq, pubsub (pstest)
	Phases      []string      // drain, baselines, steady
	Steady      time.Duration // length of each steady-state rate
	CommitFor   time.Duration // length of the commit-rate measurement
	Writers     int           // concurrent single-row writers (commit rate and steady state); 0: the best of writerSweep
	Quick       bool
	ScaleEvents int // backlog of each scaling-curve drain
	// PollNotify sets capture.poll.notify: `relay init` installs the
	// insert NOTIFY trigger that wakes poll capture at once.
	PollNotify    bool
	PollInterval  time.Duration // capture.poll.interval; 0: the relay's default
	PollLinger    time.Duration // capture.poll.linger; 0: the relay's default
	WalLinger     time.Duration // capture.wal.linger; 0: the relay's default
	KafkaLinger   time.Duration // sink.kafka.linger; 0: the relay's default
	BatchSize     int           // capture.poll.batch_size; 0: the relay's default
	Background    time.Duration // how long to sample the machine's load before starting
	Relays        int           // relays draining at once (poll mode shares the work)
	ProfileDir    string        // when set: profiling relays (an extra drain per mode, steady and impact runs) write their profiles here
	RelayBin      string        // a prebuilt relay binary; empty: go build ./cmd/relay
	RelayProcs    int           // GOMAXPROCS of the relay processes; 0: Go's default (the CPU count)
	RSSEvents     int           // when above 0: a drain this large per mode measures the relay's peak RSS (-rss)
	Consumer      bool          // also drain into NATS with a consumer reading the stream
	ImpactFor     time.Duration // length of each run of the impact phase
	ImpactClients int           // application connections of the impact phase
	ImpactSink    string        // sink of the impact phase's relays: nats or kafka (kfake)
	ImpactRate    int           // the most application transactions per second of the impact phase; 0: as fast as they go
	ImpactFloors  bool          // also run the floors of each mode in the impact phase (floorsOf)
	// ImpactModes are the relays of the impact phase: poll, wal, messages
	// (wal mode's table-free outbox) and partition (wal mode with
	// archive.mode partition).
	ImpactModes []string
	// ImpactRounds is how many times the impact phase runs its whole list
	// of runs, interleaved.
	ImpactRounds int
	// ImpactSyncCommit is the application sessions' synchronous_commit.
	ImpactSyncCommit string
	// ImpactPrevious is a git revision whose relay the impact phase also
	// runs in poll and wal mode; empty: none.
	ImpactPrevious string
	// InsertFor, InsertClients and InsertVariants are the length of each
	// run of the insert phase, its connections and the table variants it
	// measures (empty: all, see insertVariants).
	InsertFor      time.Duration
	InsertClients  int
	InsertVariants []string
	Log            io.Writer
	Args           []string // the command line, for the results
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 4 && args[0] == "-as-relay" && args[2] == "-as-relay-profile" {
		return asRelay(args[1], args[3], stderr)
	}
	if len(args) >= 3 && args[0] == "-as-floor" {
		return asFloor(args[1:], stderr)
	}
	opts, err := parseFlags(args, stderr)
	if err != nil {
		return 2
	}
	opts.Log = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, opts)
	if res != nil {
		printTable(stdout, res)
		if opts.Out != "" {
			if werr := writeJSON(opts.Out, res); werr != nil {
				fmt.Fprintf(stderr, "relaybench: %v\n", werr)
				return 1
			}
			fmt.Fprintf(stdout, "\nresults written to %s\n", opts.Out)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "relaybench: %v\n", err)
		return 1
	}
	return 0
}

// parseFlags parses the command line into Options; a usage error is
// printed to stderr.
func parseFlags(args []string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("relaybench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Options{Args: append([]string{"relaybench"}, args...)}
	lists := defineFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "relaybench: unexpected arguments %q\n", fs.Args())
		return o, fmt.Errorf("usage")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.applyQuick(set)
	if *lists.rss && o.RSSEvents == 0 {
		o.RSSEvents = rssEventsDefault
	}
	o.Modes = splitList(*lists.modes)
	o.Phases = splitList(*lists.phases)
	o.Sinks = splitList(*lists.sinks)
	o.ImpactModes = splitList(*lists.impactModes)
	o.InsertVariants = splitList(*lists.insertVariants)
	if _, err := selectedVariants(o.InsertVariants); err != nil {
		fmt.Fprintf(stderr, "relaybench: -insert-variants: %v\n", err)
		return o, fmt.Errorf("usage")
	}
	if o.ImpactSink != "nats" && o.ImpactSink != "kafka" {
		fmt.Fprintf(stderr, "relaybench: -impact-sink: unknown sink %q (nats, kafka)\n", o.ImpactSink)
		return o, fmt.Errorf("usage")
	}
	for _, c := range []struct {
		flag, what string
		got, known []string
	}{{"sinks", "sink", o.Sinks, []string{"nats", "kafka", "rabbitmq", "pubsub"}},
		{"modes", "mode", o.Modes, []string{"poll", "wal"}},
		{"impact-modes", "mode", o.ImpactModes, []string{"poll", "wal", "messages", "partition"}},
		{"phases", "phase", o.Phases, []string{"drain", "baselines", "steady", "scaling", "impact", "insert"}}} {
		for _, v := range c.got {
			if !slices.Contains(c.known, v) {
				fmt.Fprintf(stderr, "relaybench: -%s: unknown %s %q (%s)\n", c.flag, c.what, v, strings.Join(c.known, ", "))
				return o, fmt.Errorf("usage")
			}
		}
	}
	if o.Events <= 0 || o.Aggregates <= 0 || o.Payload < 40 || o.Writers < 0 || o.Relays <= 0 || o.ImpactClients <= 0 || o.ImpactRate < 0 || o.ImpactRounds <= 0 || o.InsertClients <= 0 {
		fmt.Fprintln(stderr, "relaybench: -events, -aggregates, -relays, -impact-clients, -impact-rounds and -insert-clients must be positive, -writers and -impact-rate not negative, -payload at least 40")
		return o, fmt.Errorf("usage")
	}
	return o, nil
}

// listFlags are the flags parseFlags turns into Options after parsing.
type listFlags struct {
	modes, sinks, phases, impactModes, insertVariants *string
	rss                                               *bool
}

// defineFlags defines every flag of fs into o, and returns those parsed
// further.
func defineFlags(fs *flag.FlagSet, o *Options) listFlags {
	fs.IntVar(&o.Events, "events", 1_000_000, "events in each backlog drain")
	fs.IntVar(&o.Aggregates, "aggregates", 10_000, "distinct aggregate_ids")
	fs.IntVar(&o.Payload, "payload", 200, "payload size in bytes (a JSON object padded to this size)")
	fs.StringVar(&o.Out, "out", "results.json", "JSON file for every figure; empty: none")
	l := listFlags{
		modes:          fs.String("modes", "poll,wal", "capture modes to measure, comma separated (wal is reported as not available when this build rejects it)"),
		sinks:          fs.String("sinks", "nats,kafka", "sinks of the backlog drains, comma separated: nats (embedded JetStream), kafka (kfake, franz-go's in-process fake broker), rabbitmq (a rabbitmq-server node, quorum queue), pubsub (pstest, Google's in-process Pub/Sub fake); steady state uses nats"),
		phases:         fs.String("phases", "drain,baselines,steady", "what to measure, comma separated: drain, baselines, steady, scaling (payload size, aggregates and poll relays curves; not in the default run), impact (the application's TPS and commit latency without a relay and with one per mode; not in the default run), insert (what each outbox table variant costs a single-row INSERT; not in the default run)"),
		insertVariants: fs.String("insert-variants", "", "outbox table variants of -phases insert, comma separated (default: all): "+strings.Join(variantNames(insertVariants()), ", ")),
		rss:            fs.Bool("rss", false, "also drain 1,000,000 events per mode into NATS for the relay's peak RSS (takes minutes)"),
	}
	fs.DurationVar(&o.Steady, "steady", 15*time.Second, "length of each steady-state rate (25, 50, 100 % of the commit rate)")
	fs.DurationVar(&o.CommitFor, "commit-for", 3*time.Second, "length of the single-row commit-rate measurement")
	fs.IntVar(&o.Writers, "writers", 0, "concurrent single-row writers; 0: measure the commit rate with 4, 8, 16 and 32 and use the best")
	fs.IntVar(&o.Relays, "relays", 1, "relays running at once in the drains (poll relays share the work; wal relays stand by)")
	fs.DurationVar(&o.Background, "background", 3*time.Second, "how long to sample the machine's background load before starting; 0: skip")
	fs.BoolVar(&o.PollNotify, "poll-notify", false, "set capture.poll.notify: `relay init` installs the insert NOTIFY trigger that wakes poll capture")
	fs.DurationVar(&o.PollInterval, "poll-interval", 0, "capture.poll.interval of the relay (default: the relay's default)")
	fs.DurationVar(&o.PollLinger, "poll-linger", 0, "capture.poll.linger of the relay (default: the relay's default)")
	fs.DurationVar(&o.WalLinger, "wal-linger", 0, "capture.wal.linger of the relay (default: the relay's default)")
	fs.DurationVar(&o.KafkaLinger, "kafka-linger", 0, "sink.kafka.linger of the relay (default: the relay's default)")
	fs.IntVar(&o.BatchSize, "batch-size", 0, "capture.poll.batch_size of the relay (default: the relay's default)")
	fs.IntVar(&o.ScaleEvents, "scale-events", 200_000, "events in each drain of the scaling curves (-phases scaling); one aggregate drains a tenth")
	fs.BoolVar(&o.Quick, "quick", false, "100,000 events and 4s steady phases (unless -events/-steady are given)")
	fs.StringVar(&o.ProfileDir, "cpuprofile", "", "run the relays with CPU and allocation profiles (this binary re-executed as the relay): with -phases drain an extra drain per mode writes DIR/<mode>/cpu.pprof and allocs.pprof, steady writes DIR/steady-<mode>/, impact DIR/impact-<mode>/")
	fs.StringVar(&o.RelayBin, "relay", "", "prebuilt relay binary (default: go build ./cmd/relay)")
	fs.IntVar(&o.RelayProcs, "relay-gomaxprocs", 0, "GOMAXPROCS of the relay processes (default: Go's, the CPU count)")
	fs.IntVar(&o.RSSEvents, "rss-events", 0, "events of each -rss drain (default 1,000,000; setting it implies -rss)")
	fs.BoolVar(&o.Consumer, "consumer", true, "also drain each mode into NATS while a consumer reads the stream (the CPU and allocations table has a row for each)")
	fs.DurationVar(&o.ImpactFor, "impact-for", 20*time.Second, "length of each run of -phases impact (no relay, then one per mode)")
	fs.IntVar(&o.ImpactRate, "impact-rate", 0, "the most transactions per second of all -phases impact clients together, e.g. 2000 for the relay's CPU at that rate (0: as fast as the database commits them)")
	fs.BoolVar(&o.ImpactFloors, "impact-floors", true, "also run the floors of each mode in -phases impact: a raw DELETE … RETURNING poller (poll), pg_recvlogical into /dev/null without and with a DELETE every 20 ms (wal)")
	fs.StringVar(&o.ImpactSink, "impact-sink", "nats", "sink of the relays of -phases impact: nats (embedded JetStream) or kafka (kfake)")
	l.impactModes = fs.String("impact-modes", "poll,wal,messages,partition", "relays of -phases impact, comma separated: poll, wal, messages (wal mode's table-free outbox, the clients emit messages instead of inserting rows), partition (wal mode, archive.mode partition)")
	fs.IntVar(&o.ImpactRounds, "impact-rounds", 1, "how many times -phases impact runs its list of runs, interleaved; the summary averages the rounds")
	fs.StringVar(&o.ImpactSyncCommit, "impact-sync-commit", "off", "synchronous_commit of the -phases impact clients' sessions")
	fs.StringVar(&o.ImpactPrevious, "impact-previous", "", "a git revision (e.g. a release tag) whose relay -phases impact also builds and runs in poll and wal mode")
	fs.IntVar(&o.ImpactClients, "impact-clients", 16, "application connections of -phases impact, each committing UPDATE accounts + INSERT INTO outbox transactions in a loop")
	fs.DurationVar(&o.InsertFor, "insert-for", 10*time.Second, "length of each run of -phases insert (one per outbox table variant)")
	fs.IntVar(&o.InsertClients, "insert-clients", 8, "connections of -phases insert, each committing single-row INSERT transactions with synchronous_commit off")
	return l
}

// applyQuick shortens what -quick shortens, unless set names the flag.
func (o *Options) applyQuick(set map[string]bool) {
	if !o.Quick {
		return
	}
	if !set["events"] {
		o.Events = 100_000
	}
	if !set["steady"] {
		o.Steady = 4 * time.Second
	}
	if !set["commit-for"] {
		o.CommitFor = time.Second
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func (o Options) has(phase string) bool { return slices.Contains(o.Phases, phase) }

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

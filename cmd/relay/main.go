// Command relay publishes the rows an application writes to its outbox
// table to a message broker. See README.md.
//
// Exit status: 0 success, 1 runtime failure, 2 bad usage or bad config.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/app"
	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/demo"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/schema"
)

// commands are relay's subcommands in the order usage lists them.
var commands = []command{
	{"run", "relay run    --config FILE", "run the relay until SIGINT/SIGTERM", configFlags("run")},
	{"init", "relay init   --config FILE [--dry-run] [--role NAME] [--lock-timeout 5s]",
		"create the outbox, dead-letter table, trigger and stream;\nwith --role, grant (or print) what relay run needs", configFlags("init")},
	{"check", "relay check  --config FILE", "check the config, Postgres and the sink", configFlags("check")},
	{"status", "relay status --config FILE [--json] [--endpoint URL ...] [--max-age 5m]",
		"the whole fleet's view, the same from whichever relay it\nasks: every relay the database lists and what each says,\nbacklog, slot, partitions, dead letters; exit 0 healthy, 1 not", statusFlags},
	{"dlq", "relay dlq    list|show|redrive|drop --config FILE [--id UUID ...] [--json] [--aggregate ID] [--older-than DURATION] [--all] [--limit N]",
		"list dead letters, show them whole (show ID...: every\ncolumn, payload, headers, the full error), re-publish\nthem (same ids) or delete them; redrive and drop need a\nfilter or --all, and redrive INSERT on the outbox", dlqFlags},
	{"demo", "relay demo", "run a self-contained demo (needs PostgreSQL server binaries)", demoFlags},
	{"version", "relay version", "print the version, commit and Go version", versionFlags},
	{"help", "relay help [COMMAND]", "print this usage, or a command's usage and flags", nil},
}

// A command is one subcommand: its synopsis, what it does, and setup,
// which defines its flags on fs and returns the function that runs it once
// fs has parsed the arguments.
type command struct {
	name, synopsis, summary string
	setup                   func(fs *flag.FlagSet) runFunc
}

// runFunc runs a command whose flags were parsed.
type runFunc func(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error

// usage returns the list of every command.
func usage() string {
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, c := range commands {
		lines := strings.Split(c.summary, "\n")
		if len(c.synopsis) < 43 {
			fmt.Fprintf(&b, "  %-43s%s\n", c.synopsis, lines[0])
			lines = lines[1:]
		} else {
			b.WriteString("  " + c.synopsis + "\n")
		}
		for _, line := range lines {
			fmt.Fprintf(&b, "  %-43s%s\n", "", line)
		}
	}
	b.WriteString("\nrelay help COMMAND or relay COMMAND --help shows a command's flags.\n")
	return b.String()
}

func main() {
	app.TuneGC()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit status. A command given
// -h, -help or --help prints its usage to stdout, starts nothing and
// returns 0; so does relay help COMMAND.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help":
		name = "help"
	case "--version":
		name = "version"
	}
	if name == "help" {
		return status(name, helpCommand(rest, stdout), stderr)
	}
	c, ok := lookup(name)
	if !ok {
		return status(name, &app.UsageError{Err: fmt.Errorf("unknown command %q\n%s", name, usage())}, stderr)
	}
	fs := newFlagSet(c)
	exec := c.setup(fs)
	err := fs.Parse(rest)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		err = &app.UsageError{Err: fmt.Errorf("relay %s: %w (relay help %s lists its flags)", name, err, name)}
	}
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = exec(ctx, fs, stdout, stderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		printHelp(stdout, c)
		return 0
	}
	return status(name, err, stderr)
}

// lookup returns the command called name.
func lookup(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

// newFlagSet returns a flag set for c that prints nothing itself: run
// reports its errors and printHelp its usage.
func newFlagSet(c command) *flag.FlagSet {
	fs := flag.NewFlagSet("relay "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// printHelp writes c's synopsis, summary and flags to w.
func printHelp(w io.Writer, c command) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", c.synopsis, c.summary)
	if c.setup == nil {
		return
	}
	fs := newFlagSet(c)
	c.setup(fs)
	var n int
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// helpCommand runs relay help [COMMAND]: the list of commands, or one
// command's usage and flags, on stdout.
func helpCommand(args []string, stdout io.Writer) error {
	switch {
	case len(args) == 0:
		fmt.Fprint(stdout, usage())
		return nil
	case len(args) > 1:
		return &app.UsageError{Err: errors.New("relay help: takes at most one command")}
	}
	name := args[0]
	if slices.Contains([]string{"-h", "-help", "--help"}, name) {
		name = "help"
	}
	c, ok := lookup(name)
	if !ok {
		return &app.UsageError{Err: fmt.Errorf("relay help: unknown command %q\n%s", name, usage())}
	}
	printHelp(stdout, c)
	return nil
}

// configFlags sets up run, init or check: --config and, for init, its own
// flags.
func configFlags(cmd string) func(fs *flag.FlagSet) runFunc {
	return func(fs *flag.FlagSet) runFunc {
		path := fs.String("config", "", "path to the YAML config file (required)")
		var initOpts app.InitOptions
		if cmd == "init" {
			fs.BoolVar(&initOpts.DryRun, "dry-run", false, "print the SQL instead of running it")
			fs.StringVar(&initOpts.Role, "role", "", "the `NAME` of the role relay run connects as: print (with --dry-run) or grant the privileges it needs")
			fs.DurationVar(&initOpts.LockTimeout, "lock-timeout", app.DefaultLockTimeout,
				"give up a statement that waits longer than this for a table lock the application holds")
		}
		return func(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
			if *path == "" || fs.NArg() > 0 {
				return &app.UsageError{Err: fmt.Errorf("relay %s: --config FILE is required and takes no other arguments", cmd)}
			}
			cfg, err := config.Load(*path)
			if err != nil {
				return err
			}
			log := app.NewLogger(cfg.Log, stderr)
			switch cmd {
			case "init":
				initOpts.Progress = stderr
				return app.Init(ctx, cfg, initOpts, stdout, log)
			case "check":
				return app.Check(ctx, cfg, stdout, log)
			default:
				return app.RunConfig(ctx, cfg, log)
			}
		}
	}
}

// statusFlags sets up relay status.
func statusFlags(fs *flag.FlagSet) runFunc {
	path := fs.String("config", "", "path to the YAML config file (required)")
	var opts app.StatusOptions
	fs.BoolVar(&opts.JSON, "json", false, "print one JSON object")
	fs.Func("endpoint", "base `URL` of a running relay's HTTP server to ask as well (repeatable); asked with the relays it names "+
		"when the database cannot be read (default then: from http.listen)", func(s string) error {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("must be an http:// or https:// URL, e.g. http://127.0.0.1:9090")
		}
		opts.Endpoints = append(opts.Endpoints, s)
		return nil
	})
	fs.DurationVar(&opts.MaxAge, "max-age", app.DefaultStatusMaxAge, "unhealthy when the oldest unpublished event is older")
	return func(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
		if *path == "" || fs.NArg() > 0 || opts.MaxAge <= 0 {
			return &app.UsageError{Err: fmt.Errorf("relay status: --config FILE is required, --max-age must be positive, and no other arguments are taken")}
		}
		cfg, err := config.Load(*path)
		if err != nil {
			return err
		}
		return app.Status(ctx, cfg, opts, stdout)
	}
}

// dlqFlags sets up relay dlq: the action comes first, then the flags,
// which the returned function parses after taking the action off.
func dlqFlags(fs *flag.FlagSet) runFunc {
	path := fs.String("config", "", "path to the YAML config file (required)")
	var f schema.DeadLetterFilter
	addID := func(s string) error {
		u, err := uuid.Parse(s)
		if err != nil {
			return fmt.Errorf("not a UUID: %q", s)
		}
		f.IDs = append(f.IDs, u.String())
		return nil
	}
	fs.Func("id", "a dead letter's `UUID` (repeatable); default all", addID)
	fs.StringVar(&f.Aggregate, "aggregate", "", "only this aggregate_id")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only dead letters whose last failure is older than this")
	limit := fs.Int("limit", 100, "list or show at most this many")
	all := fs.Bool("all", false, "redrive or drop every dead letter (required without --id, --aggregate or --older-than)")
	asJSON := fs.Bool("json", false, "print JSON: list and show an array of dead letters, redrive and drop the count")
	return func(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
		args := fs.Args()
		if len(args) == 0 || !slices.Contains([]string{"list", "show", "redrive", "drop"}, args[0]) {
			return &app.UsageError{Err: errors.New("relay dlq: want list, show, redrive or drop (relay help dlq shows the flags)")}
		}
		action := app.DLQAction(args[0])
		rest := args[1:]
		for action == app.DLQShow && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			if err := addID(rest[0]); err != nil {
				return &app.UsageError{Err: fmt.Errorf("relay dlq show: %w", err)}
			}
			rest = rest[1:]
		}
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return &app.UsageError{Err: fmt.Errorf("relay dlq %s: %w (relay help dlq lists its flags)", action, err)}
		}
		for _, id := range fs.Args() {
			if action != app.DLQShow {
				return &app.UsageError{Err: fmt.Errorf("relay dlq %s takes no arguments (ids go with --id), got %q", action, id)}
			}
			if err := addID(id); err != nil {
				return &app.UsageError{Err: fmt.Errorf("relay dlq show: %w", err)}
			}
		}
		if *path == "" || *limit <= 0 {
			return &app.UsageError{Err: fmt.Errorf("relay dlq %s: --config FILE is required and --limit must be positive", action)}
		}
		switch {
		case action == app.DLQShow && len(f.IDs) == 0:
			return &app.UsageError{Err: errors.New("relay dlq show: give the ids of the dead letters to show: relay dlq show ID... --config FILE (relay dlq list names them)")}
		case (action == app.DLQRedrive || action == app.DLQDrop) && f.Empty() && !*all:
			return &app.UsageError{Err: fmt.Errorf("relay dlq %s: select dead letters with --id, --aggregate or --older-than, or give --all to %s every one", action, action)}
		}
		cfg, err := config.Load(*path)
		if err != nil {
			return err
		}
		return app.DLQ(ctx, cfg, action, f, app.DLQOptions{Limit: *limit, JSON: *asJSON, Progress: stderr}, stdout)
	}
}

// demoFlags sets up relay demo, which takes no arguments.
func demoFlags(*flag.FlagSet) runFunc {
	return func(ctx context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
		if fs.NArg() > 0 {
			return &app.UsageError{Err: errors.New("relay demo: takes no arguments")}
		}
		return demo.Run(ctx, demo.Options{Out: stdout})
	}
}

// versionFlags sets up relay version, which takes no arguments.
func versionFlags(*flag.FlagSet) runFunc {
	return func(_ context.Context, fs *flag.FlagSet, stdout, stderr io.Writer) error {
		if fs.NArg() > 0 {
			return &app.UsageError{Err: errors.New("relay version: takes no arguments")}
		}
		bi := buildinfo.Read()
		fmt.Fprintf(stdout, "relay %s\ncommit %s\ngo %s\n", bi.Version, bi.Commit, bi.GoVersion)
		return nil
	}
}

// status prints err and maps it to the exit status: 0 success, 1 runtime
// failure, 2 bad usage or config. Only the long-running commands (run and
// demo) stop on SIGINT/SIGTERM by design and exit 0 then; an interrupted
// init, check or dlq did not finish and exits 1.
func status(cmd string, err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case app.IsUsage(err):
		fmt.Fprintln(stderr, "relay:", redact.String(err.Error()))
		return 2
	case errors.Is(err, context.Canceled) && (cmd == "run" || cmd == "demo"):
		return 0
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(stderr, "relay: %s interrupted before it finished: %s\n", cmd, redact.String(err.Error()))
		return 1
	default:
		fmt.Fprintln(stderr, "relay:", redact.String(err.Error()))
		return 1
	}
}

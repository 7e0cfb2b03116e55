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

const usage = `usage:
  relay run    --config FILE                 run the relay until SIGINT/SIGTERM
  relay init   --config FILE [--dry-run] [--role NAME] [--lock-timeout 5s]
                                             create the outbox, dead-letter table, trigger and stream;
                                             with --role, grant (or print) what relay run needs
  relay check  --config FILE                 check the config, Postgres and the sink
  relay status --config FILE [--json] [--endpoint URL ...] [--max-age 5m]
                                             the whole fleet's view, the same from whichever relay it
                                             asks: every relay the database lists and what each says,
                                             backlog, slot, partitions, dead letters; exit 0 healthy, 1 not
  relay dlq    list|show|redrive|drop --config FILE [--id UUID ...] [--json]
               [--aggregate ID] [--older-than DURATION] [--all] [--limit N]
                                             list dead letters, show them whole (show ID...: every
                                             column, payload, headers, the full error), re-publish
                                             them (same ids) or delete them; redrive and drop need a
                                             filter or --all, and redrive INSERT on the outbox
  relay demo                                 run a self-contained demo (needs PostgreSQL server binaries)
  relay version                              print the version, commit and Go version
`

func main() {
	if len(os.Args) > 1 && os.Args[1] == "run" {
		app.CalmSysmon()
	}
	app.TuneGC()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run", "init", "check":
		err = configCommand(ctx, cmd, rest, stdout, stderr)
	case "dlq":
		err = dlqCommand(ctx, rest, stdout, stderr)
	case "status":
		err = statusCommand(ctx, rest, stdout, stderr)
	case "demo":
		err = demo.Run(ctx, demo.Options{Out: stdout})
	case "version", "--version":
		bi := buildinfo.Read()
		fmt.Fprintf(stdout, "relay %s\ncommit %s\ngo %s\n", bi.Version, bi.Commit, bi.GoVersion)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = &app.UsageError{Err: fmt.Errorf("unknown command %q\n%s", cmd, usage)}
	}
	return status(cmd, err, stderr)
}

func configCommand(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to the YAML config file (required)")
	var initOpts app.InitOptions
	if cmd == "init" {
		fs.BoolVar(&initOpts.DryRun, "dry-run", false, "print the SQL instead of running it")
		fs.StringVar(&initOpts.Role, "role", "", "the role `relay run` connects as: print (with --dry-run) or grant the privileges it needs")
		fs.DurationVar(&initOpts.LockTimeout, "lock-timeout", app.DefaultLockTimeout,
			"give up a statement that waits longer than this for a table lock the application holds")
	}
	if err := fs.Parse(args); err != nil {
		return &app.UsageError{Err: err}
	}
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

// statusCommand runs `relay status`.
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path to the YAML config file (required)")
	var opts app.StatusOptions
	fs.BoolVar(&opts.JSON, "json", false, "print one JSON object")
	fs.Func("endpoint", "base URL of a running relay's HTTP server to ask as well (repeatable); asked with the relays it names "+
		"when the database cannot be read (default then: from http.listen)", func(s string) error {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("must be an http:// or https:// URL, e.g. http://127.0.0.1:9090")
		}
		opts.Endpoints = append(opts.Endpoints, s)
		return nil
	})
	fs.DurationVar(&opts.MaxAge, "max-age", app.DefaultStatusMaxAge, "unhealthy when the oldest unpublished event is older")
	if err := fs.Parse(args); err != nil {
		return &app.UsageError{Err: err}
	}
	if *path == "" || fs.NArg() > 0 || opts.MaxAge <= 0 {
		return &app.UsageError{Err: fmt.Errorf("relay status: --config FILE is required, --max-age must be positive, and no other arguments are taken")}
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	return app.Status(ctx, cfg, opts, stdout)
}

// dlqCommand runs `relay dlq list|show|redrive|drop`. show takes the ids
// as arguments or with --id.
func dlqCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || !slices.Contains([]string{"list", "show", "redrive", "drop"}, args[0]) {
		return &app.UsageError{Err: fmt.Errorf("relay dlq: want list, show, redrive or drop\n%s", usage)}
	}
	action := app.DLQAction(args[0])
	fs := flag.NewFlagSet("dlq "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	fs.Func("id", "a dead letter's id (repeatable); default all", addID)
	fs.StringVar(&f.Aggregate, "aggregate", "", "only this aggregate_id")
	fs.DurationVar(&f.OlderThan, "older-than", 0, "only dead letters whose last failure is older than this")
	limit := fs.Int("limit", 100, "list or show at most this many")
	all := fs.Bool("all", false, "redrive or drop every dead letter (required without --id, --aggregate or --older-than)")
	asJSON := fs.Bool("json", false, "print JSON: list and show an array of dead letters, redrive and drop the count")
	rest := args[1:]
	for action == app.DLQShow && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		if err := addID(rest[0]); err != nil {
			return &app.UsageError{Err: fmt.Errorf("relay dlq show: %w", err)}
		}
		rest = rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return &app.UsageError{Err: err}
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
		return &app.UsageError{Err: fmt.Errorf("relay dlq show: give the ids of the dead letters to show: relay dlq show ID... --config FILE (relay dlq list names them)")}
	case (action == app.DLQRedrive || action == app.DLQDrop) && f.Empty() && !*all:
		return &app.UsageError{Err: fmt.Errorf("relay dlq %s: select dead letters with --id, --aggregate or --older-than, or give --all to %s every one", action, action)}
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	return app.DLQ(ctx, cfg, action, f, app.DLQOptions{Limit: *limit, JSON: *asJSON, Progress: stderr}, stdout)
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

package app

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/progress"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
)

// DLQAction is a `relay dlq` subcommand.
type DLQAction string

// The dlq subcommands.
const (
	DLQList    DLQAction = "list"
	DLQRedrive DLQAction = "redrive"
	DLQDrop    DLQAction = "drop"
)

// DLQOptions vary DLQ.
type DLQOptions struct {
	// Limit is how many rows list prints, at most.
	Limit int
	// Progress, when set, receives redrive's progress lines (see package
	// progress), ProgressEvery apart when it is not a terminal (default
	// progress.DefaultEvery).
	Progress      io.Writer
	ProgressEvery time.Duration
}

// redriveKeys is how many ordering keys one redrive transaction moves.
const redriveKeys = 500

// DLQ lists, redrives or drops the dead letters matching f and reports to
// w. list prints at most opts.Limit rows as a table. redrive works in
// transactions of up to 500 ordering keys each, every key's dead letters in
// one, and reports its progress to opts.Progress.
func DLQ(ctx context.Context, cfg *config.Config, action DLQAction, f schema.DeadLetterFilter, opts DLQOptions, w io.Writer) error {
	l := layoutOf(cfg)
	pool, err := connect(ctx, cfg.Postgres, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, l.DeadLetter.Ident()).Scan(&exists); err != nil {
		return fmt.Errorf("dead-letter table %s: %w", l.DeadLetter, err)
	}
	if !exists {
		fmt.Fprintf(w, "no dead letters: table %s does not exist yet (relay run and relay init create it)\n", l.DeadLetter)
		return nil
	}
	switch action {
	case DLQRedrive:
		n, err := redrive(ctx, pool, l, f, cfg.DeadLetter.ParkAggregate, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "redrove %d dead letters into %s with their original ids\n", n, l.Outbox)
	case DLQDrop:
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			n, err = l.DropDeadLetters(ctx, tx, f, cfg.DeadLetter.ParkAggregate)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "dropped %d dead letters from %s\n", n, l.DeadLetter)
	default:
		dls, err := l.ListDeadLetters(ctx, pool, f, opts.Limit)
		if err != nil {
			return err
		}
		printDeadLetters(w, dls)
	}
	return nil
}

// printDeadLetters prints dls as a table. Row values and errors are shown
// with rowtext.Clean: control characters (terminal escape sequences,
// newlines, tabs) and invalid UTF-8 escaped, long values cut.
func printDeadLetters(w io.Writer, dls []schema.DeadLetter) {
	if len(dls) == 0 {
		fmt.Fprintln(w, "no dead letters")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAGGREGATE\tEVENT_TYPE\tATTEMPTS\tCLASS\tLAST_FAILED\tERROR")
	for _, d := range dls {
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s\t%s\t%s\n", rowtext.Value(d.ID), rowtext.Value(d.AggregateType),
			rowtext.Value(d.AggregateID), rowtext.Value(d.EventType), d.Attempts, rowtext.Value(d.ErrorClass),
			d.LastFailed.UTC().Format(time.RFC3339), rowtext.Clean(d.Error, 80))
	}
	tw.Flush()
}

// redrive redrives the dead letters matching f in batches of redriveKeys
// ordering keys, one transaction each, then those without a key (and any
// dead-lettered meanwhile), reporting progress; it returns how many went
// back into the outbox.
func redrive(ctx context.Context, pool *pgxpool.Pool, l schema.Layout, f schema.DeadLetterFilter, resequence bool, opts DLQOptions) (int64, error) {
	total, err := l.CountDeadLetters(ctx, pool, f)
	if err != nil {
		return 0, err
	}
	out := opts.Progress
	if out == nil {
		out = io.Discard
	}
	rep := progress.New(out, "redrive", opts.ProgressEvery)
	defer rep.Stop()
	var redriven, removed int64
	batch := func(f schema.DeadLetterFilter) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, m, err := l.Redrive(ctx, tx, f, resequence)
			redriven, removed = redriven+n, removed+m
			return err
		})
	}
	keys := f
	for {
		keys.Through = nil
		through, ok, err := l.NextKeys(ctx, pool, keys, redriveKeys)
		if err != nil {
			return redriven, err
		}
		if !ok {
			break
		}
		keys.Through = &through
		if err := batch(keys); err != nil {
			return redriven, err
		}
		rep.Update("", removed, max(total, removed), "dead letters")
		keys.After = &through
	}
	if err := batch(f); err != nil {
		return redriven, err
	}
	rep.Finish(fmt.Sprintf("%d/%d dead letters done, %d back in the outbox", removed, max(total, removed), redriven))
	return redriven, nil
}

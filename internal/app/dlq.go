package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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
	DLQShow    DLQAction = "show"
	DLQRedrive DLQAction = "redrive"
	DLQDrop    DLQAction = "drop"
)

// DLQOptions vary DLQ.
type DLQOptions struct {
	// Limit is how many rows list and show print, at most.
	Limit int
	// JSON makes list and show print a JSON array (see deadLetterJSON and
	// deadLetterRowJSON), redrive and drop a dlqResult, instead of text.
	JSON bool
	// Progress, when set, receives redrive's progress lines (see package
	// progress), ProgressEvery apart when it is not a terminal (default
	// progress.DefaultEvery).
	Progress      io.Writer
	ProgressEvery time.Duration
}

// redriveKeys is how many ordering keys one redrive transaction moves.
const redriveKeys = 500

// DLQ lists, shows, redrives or drops the dead letters matching f and
// reports to w. list prints at most opts.Limit rows as a table, show every
// column of at most opts.Limit rows; both print JSON with opts.JSON. show
// returns an error naming the ids of f it did not find. redrive and drop
// first check the privileges they need (schema.DLQPrivileges) and return
// an error with the GRANT statements when one is missing. redrive works in
// transactions of up to 500 ordering keys each, every key's dead letters
// in one, and reports its progress to opts.Progress.
func DLQ(ctx context.Context, cfg *config.Config, action DLQAction, f schema.DeadLetterFilter, opts DLQOptions, w io.Writer) error {
	l := layoutOf(cfg)
	if action == DLQRedrive && cfg.Capture.WAL.Messages() {
		return errors.New("relay dlq redrive puts dead letters back into the outbox table, which capture.wal.source messages does not have: " +
			"emit them again from the application (relay dlq show gives their content), then relay dlq drop them")
	}
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
		switch {
		case opts.JSON && (action == DLQRedrive || action == DLQDrop):
			return writeJSON(w, newDLQResult(l, action, 0))
		case opts.JSON:
			return writeJSON(w, []any{})
		}
		fmt.Fprintf(w, "no dead letters: table %s does not exist yet (relay run and relay init create it)\n", l.DeadLetter)
		return nil
	}
	if action == DLQRedrive || action == DLQDrop {
		if err := checkDLQGrants(ctx, pool, l, action, cfg.DeadLetter.ParkAggregate, cfg.Archive.Mode == schema.ArchivePartition); err != nil {
			return err
		}
	}
	switch action {
	case DLQRedrive:
		n, err := redrive(ctx, pool, l, f, cfg.DeadLetter.ParkAggregate, opts)
		if err != nil {
			return err
		}
		if opts.JSON {
			return writeJSON(w, newDLQResult(l, action, n))
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
		if opts.JSON {
			return writeJSON(w, newDLQResult(l, action, n))
		}
		fmt.Fprintf(w, "dropped %d dead letters from %s\n", n, l.DeadLetter)
	case DLQShow:
		rows, err := l.ShowDeadLetters(ctx, pool, f, opts.Limit)
		if err != nil {
			return err
		}
		return showDeadLetters(w, l, rows, f.IDs, opts.JSON)
	default:
		dls, err := l.ListDeadLetters(ctx, pool, f, opts.Limit)
		if err != nil {
			return err
		}
		if opts.JSON {
			return writeJSON(w, deadLettersJSON(dls))
		}
		printDeadLetters(w, dls)
	}
	return nil
}

// dlqResult is what redrive and drop print with --json.
type dlqResult struct {
	// Action is "redrive" or "drop".
	Action DLQAction `json:"action"`
	// Count is how many dead letters went back into the outbox (redrive)
	// or were deleted (drop).
	Count int64 `json:"count"`
	// Outbox and DeadLetterTable name the tables.
	Outbox          string `json:"outbox"`
	DeadLetterTable string `json:"dead_letter_table"`
}

func newDLQResult(l schema.Layout, action DLQAction, n int64) dlqResult {
	return dlqResult{Action: action, Count: n, Outbox: l.Outbox.String(), DeadLetterTable: l.DeadLetter.String()}
}

// checkDLQGrants returns an error naming the privileges of
// schema.DLQPrivileges the current role lacks for action, why each is
// needed and the GRANT statements, before anything is changed. ring is
// archive mode partition.
func checkDLQGrants(ctx context.Context, pool *pgxpool.Pool, l schema.Layout, action DLQAction, resequence, ring bool) error {
	missing, _, err := schema.MissingPrivileges(ctx, pool, l.DLQPrivileges(action == DLQRedrive, resequence, ring))
	if err != nil || len(missing) == 0 {
		return err
	}
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		return fmt.Errorf("read the current role: %w", err)
	}
	return fmt.Errorf("role %s lacks privileges `relay dlq %s` needs; nothing was changed:\n  %s\n"+
		"or run relay dlq with a config whose postgres.url names a role that has them (the outbox's owner, say; see docs/operations.md)",
		schema.Q(role), action, strings.Join(grantFix(missing, role), "\n  "))
}

// printDeadLetters prints dls as a table. Row values and errors are shown
// with rowtext.Clean: control characters (terminal escape sequences,
// newlines, tabs) and invalid UTF-8 escaped, values cut to
// rowtext.ValueBytes; the error, last, to rowtext.ErrorBytes, which is
// what the dead-letter table keeps of it.
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
			d.LastFailed.UTC().Format(time.RFC3339), rowtext.Error(d.Error))
	}
	tw.Flush()
}

// deadLetterJSON is one dead letter of `relay dlq list --json`. Strings
// hold the values whole; invalid UTF-8 (possible in a SQL_ASCII database)
// is replaced with U+FFFD and the field named in InvalidUTF8.
type deadLetterJSON struct {
	ID            string    `json:"id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Attempts      int       `json:"attempts"`
	ErrorClass    string    `json:"error_class"`
	LastFailedAt  time.Time `json:"last_failed_at"`
	Error         string    `json:"error"`
	InvalidUTF8   []string  `json:"invalid_utf8,omitempty"`
}

// deadLettersJSON returns dls as `relay dlq list --json` prints them.
func deadLettersJSON(dls []schema.DeadLetter) []deadLetterJSON {
	out := make([]deadLetterJSON, 0, len(dls))
	for _, d := range dls {
		j := deadLetterJSON{Attempts: d.Attempts, LastFailedAt: d.LastFailed.UTC()}
		for _, f := range []struct {
			name string
			dst  *string
			from string
		}{{"id", &j.ID, d.ID}, {"aggregate_type", &j.AggregateType, d.AggregateType}, {"aggregate_id", &j.AggregateID, d.AggregateID},
			{"event_type", &j.EventType, d.EventType}, {"error_class", &j.ErrorClass, d.ErrorClass}, {"error", &j.Error, d.Error}} {
			if *f.dst = strings.ToValidUTF8(f.from, "\uFFFD"); *f.dst != f.from {
				j.InvalidUTF8 = append(j.InvalidUTF8, f.name)
			}
		}
		out = append(out, j)
	}
	return out
}

// deadLetterRowJSON is one dead letter of `relay dlq show --json`: every
// column of the dead-letter table by name, its text form as PostgreSQL
// prints it (bytea as \x and hex digits, json and jsonb as JSON text) or
// null, and its type. Invalid UTF-8 (possible in a SQL_ASCII database) is
// replaced with U+FFFD and the column named in InvalidUTF8.
type deadLetterRowJSON struct {
	Values      map[string]*string `json:"values"`
	Types       map[string]string  `json:"types"`
	InvalidUTF8 []string           `json:"invalid_utf8,omitempty"`
}

// showDeadLetters prints rows, each a dead letter's columns, as text
// (rowtext.Clean escapes control characters and invalid UTF-8, nothing is
// cut) or JSON, and returns an error naming the ids it did not find.
func showDeadLetters(w io.Writer, l schema.Layout, rows [][]schema.Column, ids []string, asJSON bool) error {
	found := map[string]bool{}
	out := make([]deadLetterRowJSON, 0, len(rows))
	for i, row := range rows {
		j := deadLetterRowJSON{Values: map[string]*string{}, Types: map[string]string{}}
		if !asJSON {
			fmt.Fprintf(w, "dead letter %d of %d\n", i+1, len(rows))
		}
		for _, c := range row {
			if c.Name == l.Cols.ID && c.Value != nil {
				found[strings.ToLower(*c.Value)] = true
			}
			if !asJSON {
				v := "NULL"
				if c.Value != nil {
					v = rowtext.Clean(*c.Value, len(*c.Value)*4+1)
				}
				fmt.Fprintf(w, "  %-18s %s\n", rowtext.Value(c.Name), v)
				continue
			}
			j.Types[c.Name] = c.Type
			if c.Value == nil {
				j.Values[c.Name] = nil
				continue
			}
			v := strings.ToValidUTF8(*c.Value, "\uFFFD")
			if v != *c.Value {
				j.InvalidUTF8 = append(j.InvalidUTF8, c.Name)
			}
			j.Values[c.Name] = &v
		}
		out = append(out, j)
	}
	if asJSON {
		if err := writeJSON(w, out); err != nil {
			return err
		}
	}
	var missing []string
	for _, id := range ids {
		if !found[strings.ToLower(id)] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no dead letter with id %s in %s", strings.Join(missing, ", "), l.DeadLetter)
	}
	return nil
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

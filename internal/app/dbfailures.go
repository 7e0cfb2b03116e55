package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/pgerr"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/wait"
)

// dbFailures wraps the capture source to handle database failures that do
// not pass by retrying at once: a failure that will not pass by itself
// (pgerr.Lasting: a missing grant, table or column), whether a claim or a
// batch's archive or dead-letter insert failed, and any other failed
// archive (a trigger that raises, a constraint of the dead-letter table, a
// row lock past the archive's timeout). It logs one line when such a
// failure begins (for a lasting one naming the object and the statement
// that fixes it), reports not ready, and lets at most one capture through
// per backoff (initial doubling to max), so an archive that keeps failing
// does not republish the same events in a loop. After fatalAfter of a
// lasting failure Next returns a permanent error, which stops the relay
// with exit status 1; other archive failures are retried as long as they
// last. A successful claim ends a claim's failure, a successful archive any
// failure. A source's Next error marked capture.ErrArchive (wal ends its
// stream after a failed archive) is not a failure of its own: the batch's
// Complete reported it, and it may be older than an archive that worked
// since. Next is called from one goroutine; batches complete on others.
type dbFailures struct {
	capture.Source
	log          *slog.Logger
	layout       schema.Layout
	cfg          *config.Config
	role         string
	initial, max time.Duration
	fatalAfter   time.Duration

	mu       sync.Mutex
	failure  error     // the failure in progress, nil when none
	archive  bool      // failure came from an archive, which only an archive ends
	since    time.Time // when failure began
	lasting  time.Time // when its first lasting error came; zero: none yet
	failures int       // failures since then, for the backoff
}

// Next waits out the backoff while a failure persists, then captures; it
// gives up with a permanent error once a lasting failure has lasted
// fatalAfter.
func (g *dbFailures) Next(ctx context.Context) (capture.Batch, error) {
	for {
		if err := g.hold(ctx); err != nil {
			return nil, err
		}
		b, err := g.Source.Next(ctx)
		switch {
		case err != nil && errors.Is(err, capture.ErrArchive):
			// The batch's Complete reported this failure already, and a
			// later archive may have worked since: the source ends its
			// stream after the fact, so this is no news of its own.
			continue
		case err != nil && pgerr.Lasting(err):
			g.fail(err, false)
		case err != nil:
			return nil, err
		default:
			g.recover(false)
			return &guardedBatch{Batch: b, g: g}, nil
		}
	}
}

// hold sleeps the backoff of a persisting failure, or returns the
// permanent error once a lasting one has lasted fatalAfter.
func (g *dbFailures) hold(ctx context.Context) error {
	g.mu.Lock()
	err, lasting, n := g.failure, g.lasting, g.failures
	g.mu.Unlock()
	if err == nil {
		return nil
	}
	delay := min(g.initial<<min(n-1, 20), g.max)
	if !lasting.IsZero() {
		left := g.fatalAfter - time.Since(lasting)
		if left <= 0 {
			return fault.AsPermanent(fmt.Errorf("database failure for %s (postgres.fatal_after); fix: %s: %w",
				g.fatalAfter, g.fix(err), err))
		}
		delay = min(delay, left)
	}
	return wait.Sleep(ctx, delay)
}

// fail records a failure of a claim or, with archive, of an archive,
// logging it when it begins and when its first lasting error comes.
func (g *dbFailures) fail(err error, archive bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	g.failures++
	g.archive = g.archive || archive
	begins := g.failure == nil
	if begins {
		g.since = now
	}
	g.failure = err
	switch {
	case pgerr.Lasting(err) && g.lasting.IsZero():
		g.lasting = now
		g.log.Error("the database refuses the relay's statements; this will not pass by itself",
			"err", err, "fix", g.fix(err), "exit_in", g.fatalAfter)
	case begins:
		g.log.Warn("archiving fails; the batch's events stay in the outbox and are published again with the same message_id, with backoff until an archive works",
			"err", err)
	default:
		g.log.Debug("database failure persists", "err", err)
	}
}

// recover ends a failure after a successful archive, or a claim failure
// after a successful claim (archive false).
func (g *dbFailures) recover(archive bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failure == nil || (g.archive && !archive) {
		return
	}
	g.log.Info("database failure resolved", "after", time.Since(g.since).Round(time.Millisecond))
	g.failure, g.archive, g.lasting, g.failures = nil, false, time.Time{}, 0
}

// failing returns the failure in progress, or nil.
func (g *dbFailures) failing() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failure
}

// fix names the statement or action that ends err.
func (g *dbFailures) fix(err error) string {
	pe := pgerr.Of(err)
	switch {
	case pe == nil:
		return "run `relay check`"
	case pe.Code == "42501":
		kind, name, _ := strings.Cut(strings.TrimPrefix(pe.Message, "permission denied for "), " ")
		switch kind {
		case "table":
			if grant := g.tableGrant(name); grant != "" {
				return grant
			}
		case "sequence":
			return fmt.Sprintf("GRANT SELECT ON SEQUENCE %s TO %s", schema.Q(name), schema.Q(g.role))
		case "schema":
			return fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", schema.Q(name), schema.Q(g.role))
		}
		return "grant what `relay check` lists to " + g.role
	case strings.HasPrefix(pe.Code, "28"):
		return "check the user and password of postgres.url"
	}
	return "run `relay init` to create what is missing, or fix outbox.table / outbox.columns"
}

// tableGrant returns the GRANT statement giving the role what `relay run`
// needs (schema.RunPrivileges) on the relay's table of that unqualified
// name, or "".
func (g *dbFailures) tableGrant(name string) string {
	l := g.layout
	needs := runPrivileges(g.cfg, schema.Info{})
	for _, t := range []schema.Table{l.Outbox, l.DeadLetter, l.Archive, l.DrainTable()} {
		if t.Name != name {
			continue
		}
		var on []schema.Privilege
		for _, p := range needs {
			if p.Kind == "TABLE" && p.Object == t.Ident() {
				on = append(on, p)
			}
		}
		if len(on) > 0 {
			return schema.GrantSQL(on, g.role)[0]
		}
	}
	return ""
}

// guardedBatch reports its archive's failures and successes to the guard,
// but not a failure because ctx ended (the relay stops).
type guardedBatch struct {
	capture.Batch
	g *dbFailures
}

// Unwrap returns the source's batch (see capture.EpochOf).
func (b *guardedBatch) Unwrap() capture.Batch { return b.Batch }

func (b *guardedBatch) Complete(ctx context.Context, o capture.Outcome) error {
	err := b.Batch.Complete(ctx, o)
	switch {
	case err == nil:
		b.g.recover(true)
	case ctx.Err() == nil:
		b.g.fail(err, true)
	}
	return err
}

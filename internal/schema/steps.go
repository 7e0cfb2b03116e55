package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/fault"
)

// Step is one object `relay init` creates when it is missing. Its
// statements run outside a transaction, one by one.
type Step struct {
	// Object names it for messages, e.g. "index outbox_relay_seq_idx on
	// public.outbox".
	Object string
	// Probe is a query returning true when the object is missing (for an
	// index: missing or INVALID).
	Probe string
	// Repair, for an index, drops an INVALID copy an interrupted CREATE
	// INDEX CONCURRENTLY left behind; empty otherwise.
	Repair string
	// Create creates the object (with Drop: removes it).
	Create []string
	// Drop marks a step removing an object that is present: Probe is true
	// when it exists.
	Drop bool
}

// index is an index on a table, named after the table and suffix.
type index struct {
	table  Table
	suffix string
	def    string // column list and predicate, e.g. ("seq") WHERE ...
	unique bool
}

func (ix index) name() string { return derived(ix.table.Name, ix.suffix) }

// create returns the CREATE INDEX statement, CONCURRENTLY when asked (an
// existing table the application writes to), plain otherwise (a table
// created in the same transaction).
func (ix index) create(concurrently bool) string {
	c, u := "", ""
	if concurrently {
		c = "CONCURRENTLY "
	}
	if ix.unique {
		u = "UNIQUE "
	}
	return fmt.Sprintf(`CREATE %sINDEX %sIF NOT EXISTS %s ON %s %s`, u, c, Q(ix.name()), ix.table.Ident(), ix.def)
}

// step returns the step building the index concurrently, after dropping
// an INVALID copy.
func (ix index) step() Step {
	qualified := sibling(ix.table, ix.suffix)
	return Step{
		Object: fmt.Sprintf("index %s on %s", ix.name(), ix.table),
		Probe: fmt.Sprintf(`SELECT NOT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND indisvalid)`,
			Literal(qualified)),
		Repair: "DROP INDEX CONCURRENTLY IF EXISTS " + qualified,
		Create: []string{ix.create(true)},
	}
}

// tableStep returns the step creating table t with stmts when it is missing.
func tableStep(what string, t Table, stmts ...string) Step {
	return Step{Object: what + " " + t.String(), Probe: missingTable(t), Create: stmts}
}

func missingTable(t Table) string {
	return fmt.Sprintf(`SELECT to_regclass(%s) IS NULL`, Literal(t.Ident()))
}

// SQL returns the step as commented SQL for `relay init --dry-run`.
func (s Step) SQL() string {
	var b strings.Builder
	if s.Drop {
		fmt.Fprintf(&b, "-- remove %s, when present:\n", s.Object)
	} else {
		fmt.Fprintf(&b, "-- %s, when missing:\n", s.Object)
	}
	if s.Repair != "" {
		fmt.Fprintf(&b, "-- (if an interrupted earlier run left it INVALID, first: %s;)\n", s.Repair)
	}
	b.WriteString(strings.Join(s.Create, ";\n"))
	return b.String()
}

// Run creates the object when Probe says it is missing; nothing is
// executed for an object that exists.
func (s Step) Run(ctx context.Context, q Querier) error {
	var missing bool
	if err := q.QueryRow(ctx, s.Probe).Scan(&missing); err != nil {
		return fmt.Errorf("inspect %s: %w", s.Object, err)
	}
	if !missing {
		return nil
	}
	stmts := s.Create
	if s.Repair != "" {
		stmts = append([]string{s.Repair}, stmts...)
	}
	for _, stmt := range stmts {
		if _, err := q.Exec(ctx, stmt); err != nil {
			return &StepError{Step: s, Statement: stmt, Err: err}
		}
	}
	return nil
}

// StepError is a failed statement of a Step.
type StepError struct {
	Step      Step
	Statement string
	Err       error
}

// codeLockNotAvailable is the SQLSTATE of a lock_timeout.
const codeLockNotAvailable = "55P03"

func (e *StepError) Error() string {
	verb := "create"
	if e.Step.Drop {
		verb = "remove"
	}
	var pgErr *pgconn.PgError
	if errors.As(e.Err, &pgErr) && pgErr.Code == codeLockNotAvailable {
		return fmt.Sprintf("%s %s: gave up after lock_timeout waiting for a lock: the application holds a lock on the table "+
			"(an open transaction), and waiting longer would hold its writes behind this statement; "+
			"run `relay init` again later, it continues where this run stopped (or raise --lock-timeout)\nstatement: %s",
			verb, e.Step.Object, e.Statement)
	}
	return fmt.Sprintf("%s %s: %v\nstatement: %s", verb, e.Step.Object, e.Err, e.Statement)
}

func (e *StepError) Unwrap() error { return e.Err }

// createMissing creates an object relay run found missing, with stmts run
// as one transaction. A role that may not create it gets a permanent error
// naming the object and `relay init`.
func createMissing(ctx context.Context, q Querier, what string, stmts []string) error {
	_, err := q.Exec(ctx, strings.Join(stmts, ";\n"))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fault.AsPermanent(fmt.Errorf("%s does not exist and this role may not create it (%s): run `relay init` as the owner of the outbox table", what, pgErr.Message))
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", what, err)
	}
	return nil
}

// ensureTable creates table t with stmts (one transaction) when it is
// missing; it issues no DDL for a table that exists.
func ensureTable(ctx context.Context, q Querier, what string, t Table, stmts []string) error {
	var missing bool
	if err := q.QueryRow(ctx, missingTable(t)).Scan(&missing); err != nil {
		return fmt.Errorf("inspect %s %s: %w", what, t, err)
	}
	if !missing {
		return nil
	}
	return createMissing(ctx, q, what+" "+t.String(), stmts)
}

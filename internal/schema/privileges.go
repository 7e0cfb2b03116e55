package schema

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Privilege is one privilege `relay run` needs on one object.
type Privilege struct {
	// Kind is SCHEMA, TABLE, SEQUENCE, or ROLE for the replication
	// privilege of the relay's own role (Object is then empty).
	Kind string
	// Object is the quoted name as GRANT takes it.
	Object string
	// Priv is SELECT, INSERT, UPDATE, DELETE, TRUNCATE, USAGE or
	// REPLICATION.
	Priv string
	// Column, when set, makes it a column privilege (quoted).
	Column string
	// AnyColumn makes Priv on any column of the table enough, as for the
	// row locks of SELECT … FOR UPDATE; Column is the one to grant.
	AnyColumn bool
	// Why names what `relay run` does that needs it.
	Why string
}

// String names the privilege and its object, as in "UPDATE on a column of
// table "public"."outbox"".
func (p Privilege) String() string {
	switch {
	case p.Kind == "ROLE":
		return "the replication privilege"
	case p.AnyColumn:
		return p.Priv + " on a column of table " + p.Object
	case p.Column != "":
		return p.Priv + " on column " + p.Column + " of table " + p.Object
	}
	return p.Priv + " on " + strings.ToLower(p.Kind) + " " + p.Object
}

// RunNeeds says what `relay run` does, which decides its privileges.
type RunNeeds struct {
	// WAL is capture mode wal (poll otherwise).
	WAL bool
	// ArchiveMode is archive.mode.
	ArchiveMode string
	// Prune is set when archive.retention prunes archived rows.
	Prune bool
	// Sequence is the quoted name of the sequence behind the seq column;
	// empty: the name PostgreSQL gives an identity column of a new table.
	Sequence string
	// NoSeq is an outbox without a seq column (wal mode, see
	// Info.Missing): no sequence is read.
	NoSeq bool
	// Partitions are the quoted partitions of archive mode partition's
	// ring outbox, which the relay truncates.
	Partitions []string
	// Messages is the table-free outbox of wal mode (capture.wal.source
	// messages): no outbox, archive or drain table.
	Messages bool
}

// claimWhy is why the outbox's rows are claimed with row locks.
func (n RunNeeds) claimWhy() string {
	if n.WAL {
		return "wal mode's table drain (after a lost slot, and for held destinations) claims rows with SELECT … FOR UPDATE SKIP LOCKED"
	}
	return "poll capture claims rows with SELECT … FOR UPDATE SKIP LOCKED"
}

// RunPrivileges lists the privileges `relay run` needs with n and nothing
// more; `relay run` checks them all at start, `relay check` reports them
// and `relay init --role` grants them. They are: USAGE on the schemas;
// SELECT and DELETE on the outbox, UPDATE on any one column (SELECT … FOR
// UPDATE needs it; granted on the id column) in both modes, as wal mode's
// table drain claims like poll mode; UPDATE on published_at (mark), INSERT
// on the archive table (move; SELECT and DELETE too when pruning), TRUNCATE
// on each partition of the ring outbox (partition); SELECT,
// INSERT, DELETE on the dead-letter table; SELECT on the seq sequence (the
// claim watermark); in wal mode all four on the drain table and the
// replication privilege (Kind ROLE).
func (l Layout) RunPrivileges(n RunNeeds) []Privilege {
	if n.Messages {
		return l.messagePrivileges()
	}
	var out []Privilege
	add := func(kind, obj, why string, privs ...string) {
		for _, p := range privs {
			out = append(out, Privilege{Kind: kind, Object: obj, Priv: p, Why: why})
		}
	}
	schemas := []string{l.Outbox.Schema, l.DeadLetter.Schema}
	if n.ArchiveMode == ArchiveMove {
		schemas = append(schemas, l.Archive.Schema)
	}
	slices.Sort(schemas)
	for _, s := range slices.Compact(schemas) {
		add("SCHEMA", Q(s), "every statement of the relay names its tables in it", "USAGE")
	}
	o := l.Outbox.Ident()
	add("TABLE", o, "capture reads the outbox", "SELECT")
	add("TABLE", o, "published rows are deleted (archive modes delete and move, dead-lettering, pruning)", "DELETE")
	out = append(out, Privilege{Kind: "TABLE", Object: o, Priv: "UPDATE", Column: Q(l.Cols.ID), AnyColumn: true, Why: n.claimWhy()})
	switch n.ArchiveMode {
	case ArchiveMark:
		out = append(out, Privilege{Kind: "TABLE", Object: o, Priv: "UPDATE", Column: Q(PublishedAt),
			Why: "archive.mode mark sets published_at on published rows"})
	case ArchiveMove:
		add("TABLE", l.Archive.Ident(), "archive.mode move copies published rows into the archive table", "INSERT")
		if n.Prune {
			add("TABLE", l.Archive.Ident(), "archive.retention prunes archived rows", "SELECT", "DELETE")
		}
	}
	for _, p := range n.Partitions {
		add("TABLE", p, "archive.mode partition truncates a partition of the outbox once every row in it was published", "TRUNCATE")
	}
	add("TABLE", l.DeadLetter.Ident(), "events that fail for good are dead-lettered, counted and their aggregates parked",
		"SELECT", "INSERT", "DELETE")
	seq := n.Sequence
	if seq == "" {
		seq = sibling(l.Outbox, "_"+l.Cols.Seq+"_seq")
	}
	if !n.NoSeq {
		add("SEQUENCE", seq, "the claim reads the seq sequence as its watermark (poll capture, wal mode's table drain)", "SELECT")
	}
	if n.WAL {
		add("TABLE", l.DrainTable().Ident(), "wal mode records there the table drain it owes a new or recreated slot (slot loss)",
			"SELECT", "INSERT", "UPDATE", "DELETE")
		add("ROLE", "", "wal capture streams from a replication slot (Amazon RDS/Aurora: GRANT rds_replication instead)", "REPLICATION")
	}
	return out
}

// messagePrivileges are RunPrivileges for the table-free outbox: USAGE on
// the dead-letter table's schema, SELECT (the dead-letter count) and
// INSERT on it, and the replication privilege; no grant on any outbox
// table.
func (l Layout) messagePrivileges() []Privilege {
	dl := l.DeadLetter.Ident()
	why := "malformed outbox messages and events that fail for good are dead-lettered and counted"
	return []Privilege{
		{Kind: "SCHEMA", Object: Q(l.DeadLetter.Schema), Priv: "USAGE", Why: "the relay names the dead-letter table in it"},
		{Kind: "TABLE", Object: dl, Priv: "SELECT", Why: why},
		{Kind: "TABLE", Object: dl, Priv: "INSERT", Why: why},
		{Kind: "ROLE", Priv: "REPLICATION", Why: "the table-free outbox streams from a replication slot (Amazon RDS/Aurora: GRANT rds_replication instead)"},
	}
}

// DLQPrivileges lists the privileges `relay dlq redrive` (redrive) or
// `relay dlq drop` needs, resequence being dead_letter.park_aggregate:
// USAGE on the schemas and SELECT and DELETE on the dead-letter table for
// both; for redrive SELECT and INSERT on the outbox, into which it puts
// the dead letters back; with resequence SELECT, INSERT and DELETE on the
// outbox, to re-insert the events their aggregates left parked; for
// redrive of the ring outbox (ring, archive mode partition) DELETE on the
// outbox, to remove the dead-lettered rows it still holds, and USAGE on
// its seq sequence, which the insert's default draws from; each
// privilege listed once. `relay
// run` never inserts into the outbox, so its role lacks INSERT unless it
// is granted.
func (l Layout) DLQPrivileges(redrive, resequence, ring bool) []Privilege {
	var out []Privilege
	add := func(kind, obj, why string, privs ...string) {
		for _, p := range privs {
			out = append(out, Privilege{Kind: kind, Object: obj, Priv: p, Why: why})
		}
	}
	schemas := []string{l.Outbox.Schema, l.DeadLetter.Schema}
	slices.Sort(schemas)
	for _, s := range slices.Compact(schemas) {
		add("SCHEMA", Q(s), "relay dlq names its tables in it", "USAGE")
	}
	add("TABLE", l.DeadLetter.Ident(), "relay dlq reads the dead letters and deletes those it redrives or drops", "SELECT", "DELETE")
	o := l.Outbox.Ident()
	parked := "with dead_letter.park_aggregate, the events an aggregate left parked in the outbox are re-inserted after the others"
	switch {
	case redrive:
		add("TABLE", o, "relay dlq redrive inserts the dead letters back into the outbox, with their original ids", "SELECT", "INSERT")
	case resequence:
		add("TABLE", o, parked, "SELECT", "INSERT")
	}
	switch {
	case resequence:
		add("TABLE", o, parked, "DELETE")
	case redrive && ring:
		add("TABLE", o, "with archive.mode partition, relay dlq redrive deletes the dead-lettered rows the outbox still holds before inserting them back", "DELETE")
	}
	if redrive && ring {
		add("SEQUENCE", l.seqSequence().Ident(), "with archive.mode partition, the outbox's seq defaults to the next value of this sequence", "USAGE")
	}
	return out
}

// GrantSQL returns the GRANT statements giving role the privileges ps, one
// per object, in the order the objects first appear; the replication
// privilege (Kind ROLE) is an ALTER ROLE statement.
func GrantSQL(ps []Privilege, role string) []string {
	type target struct{ kind, obj string }
	var order []target
	privs := map[target][]string{}
	cols := map[target]map[string][]string{}
	for _, p := range ps {
		t := target{p.Kind, p.Object}
		if _, ok := privs[t]; !ok {
			order = append(order, t)
			privs[t], cols[t] = nil, map[string][]string{}
		}
		if p.Column == "" {
			privs[t] = append(privs[t], p.Priv)
			continue
		}
		if cols[t][p.Priv] == nil {
			privs[t] = append(privs[t], p.Priv+" (")
		}
		cols[t][p.Priv] = append(cols[t][p.Priv], p.Column)
	}
	var out []string
	for _, t := range order {
		if t.kind == "ROLE" {
			out = append(out, "ALTER ROLE "+Q(role)+" WITH REPLICATION")
			continue
		}
		list := slices.Clone(privs[t])
		for i, p := range list {
			if name, ok := strings.CutSuffix(p, " ("); ok {
				list[i] = name + " (" + strings.Join(cols[t][name], ", ") + ")"
			}
		}
		out = append(out, fmt.Sprintf("GRANT %s ON %s %s TO %s", strings.Join(list, ", "), t.kind, t.obj, Q(role)))
	}
	return out
}

// MissingPrivileges returns the privileges of ps the current role lacks on
// objects that exist, and the objects of ps that do not exist. Privileges
// held through membership in a role that the current role inherits from
// count, as PostgreSQL's has_*_privilege functions count them; SELECT on a
// sequence is also met by USAGE, which lets pg_sequence_last_value read it.
func MissingPrivileges(ctx context.Context, q Querier, ps []Privilege) (missing []Privilege, absent []string, err error) {
	seen := map[string]bool{}
	for _, p := range ps {
		var has *bool
		switch {
		case p.Kind == "ROLE":
			err = q.QueryRow(ctx, CanReplicate).Scan(&has)
		case p.Kind == "SCHEMA":
			err = q.QueryRow(ctx, `SELECT has_schema_privilege(to_regnamespace($1), $2)`, p.Object, p.Priv).Scan(&has)
		case p.AnyColumn:
			err = q.QueryRow(ctx, `SELECT has_any_column_privilege(to_regclass($1), $2)`, p.Object, p.Priv).Scan(&has)
		case p.Column != "":
			err = q.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_attribute
				WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)
				THEN has_column_privilege(to_regclass($1), $2::text, $3) END`, p.Object, unquote(p.Column), p.Priv).Scan(&has)
		case p.Kind == "SEQUENCE" && p.Priv == "SELECT":
			err = q.QueryRow(ctx, `SELECT has_sequence_privilege(to_regclass($1), 'SELECT, USAGE')`, p.Object).Scan(&has)
		case p.Kind == "SEQUENCE":
			err = q.QueryRow(ctx, `SELECT has_sequence_privilege(to_regclass($1), $2)`, p.Object, p.Priv).Scan(&has)
		default:
			err = q.QueryRow(ctx, `SELECT has_table_privilege(to_regclass($1), $2)`, p.Object, p.Priv).Scan(&has)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("check %s: %w", p, err)
		}
		obj := strings.ToLower(p.Kind) + " " + p.Object
		if p.Column != "" && !p.AnyColumn {
			obj = "column " + p.Column + " of " + p.Object
		}
		switch {
		case has == nil && !seen[obj]:
			seen[obj] = true
			absent = append(absent, obj)
		case has != nil && !*has:
			missing = append(missing, p)
		}
	}
	return missing, absent, nil
}

// unquote reverses Q.
func unquote(quoted string) string {
	return strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(quoted, `"`), `"`), `""`, `"`)
}

// CanReplicate is a query returning whether the current role may use
// replication: the REPLICATION attribute, superuser, or membership in
// rds_replication where that role exists (Amazon RDS and Aurora grant
// replication through it).
var CanReplicate = canReplicate("current_user")

// RoleCanReplicate is CanReplicate for the role named by parameter $1; it
// returns no row when that role does not exist.
var RoleCanReplicate = canReplicate("$1::name")

// canReplicate returns the query of CanReplicate for the role name expr.
func canReplicate(expr string) string {
	return `SELECT r.rolreplication OR r.rolsuper OR coalesce(
	(SELECT pg_has_role(` + expr + `, p.oid, 'MEMBER') FROM pg_roles p WHERE p.rolname = 'rds_replication'), false)
	FROM pg_roles r WHERE r.rolname = ` + expr
}

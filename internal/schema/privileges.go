package schema

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Privilege is one privilege `relay run` needs on one object.
type Privilege struct {
	// Kind is SCHEMA, TABLE or SEQUENCE.
	Kind string
	// Object is the quoted name as GRANT takes it.
	Object string
	// Priv is SELECT, INSERT, UPDATE, DELETE or USAGE.
	Priv string
	// Column, when set, makes it a column privilege (quoted).
	Column string
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
}

// RunPrivileges lists the privileges `relay run` needs and nothing more:
// USAGE on the schemas; SELECT and DELETE on the outbox, UPDATE on its id
// column (SELECT … FOR UPDATE needs one updatable column; wal mode's drain
// of rows older than the slot claims like poll mode), UPDATE on
// published_at (mark), INSERT on the archive table (move; SELECT and DELETE
// too when pruning); SELECT, INSERT, DELETE on the dead-letter table;
// SELECT on the seq sequence (the claim watermark); in wal mode all four
// on the drain table. The replication privilege is not a GRANT on an
// object and is not listed.
func (l Layout) RunPrivileges(n RunNeeds) []Privilege {
	var out []Privilege
	add := func(kind, obj, col string, privs ...string) {
		for _, p := range privs {
			out = append(out, Privilege{Kind: kind, Object: obj, Priv: p, Column: col})
		}
	}
	schemas := []string{l.Outbox.Schema, l.DeadLetter.Schema}
	if n.ArchiveMode == ArchiveMove {
		schemas = append(schemas, l.Archive.Schema)
	}
	slices.Sort(schemas)
	for _, s := range slices.Compact(schemas) {
		add("SCHEMA", Q(s), "", "USAGE")
	}
	o := l.Outbox.Ident()
	add("TABLE", o, "", "SELECT", "DELETE")
	add("TABLE", o, Q(l.Cols.ID), "UPDATE")
	switch n.ArchiveMode {
	case ArchiveMark:
		add("TABLE", o, Q(PublishedAt), "UPDATE")
	case ArchiveMove:
		add("TABLE", l.Archive.Ident(), "", "INSERT")
		if n.Prune {
			add("TABLE", l.Archive.Ident(), "", "SELECT", "DELETE")
		}
	}
	add("TABLE", l.DeadLetter.Ident(), "", "SELECT", "INSERT", "DELETE")
	seq := n.Sequence
	if seq == "" {
		seq = sibling(l.Outbox, "_"+l.Cols.Seq+"_seq")
	}
	add("SEQUENCE", seq, "", "SELECT")
	if n.WAL {
		add("TABLE", l.DrainTable().Ident(), "", "SELECT", "INSERT", "UPDATE", "DELETE")
	}
	return out
}

// GrantSQL returns the GRANT statements giving role the privileges ps, one
// per object, in the order the objects first appear.
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
// objects that exist, and the objects of ps that do not exist.
func MissingPrivileges(ctx context.Context, q Querier, ps []Privilege) (missing []Privilege, absent []string, err error) {
	seen := map[string]bool{}
	for _, p := range ps {
		var has *bool
		switch {
		case p.Kind == "SCHEMA":
			err = q.QueryRow(ctx, `SELECT has_schema_privilege(to_regnamespace($1), $2)`, p.Object, p.Priv).Scan(&has)
		case p.Column != "":
			err = q.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_attribute
				WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)
				THEN has_column_privilege(to_regclass($1), $2::text, $3) END`, p.Object, unquote(p.Column), p.Priv).Scan(&has)
		case p.Kind == "SEQUENCE":
			err = q.QueryRow(ctx, `SELECT has_sequence_privilege(to_regclass($1), $2)`, p.Object, p.Priv).Scan(&has)
		default:
			err = q.QueryRow(ctx, `SELECT has_table_privilege(to_regclass($1), $2)`, p.Object, p.Priv).Scan(&has)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("check privilege %s on %s: %w", p.Priv, p.Object, err)
		}
		obj := strings.ToLower(p.Kind) + " " + p.Object
		if p.Column != "" {
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
const CanReplicate = `SELECT r.rolreplication OR r.rolsuper OR coalesce(
	(SELECT pg_has_role(current_user, p.oid, 'MEMBER') FROM pg_roles p WHERE p.rolname = 'rds_replication'), false)
	FROM pg_roles r WHERE r.rolname = current_user`

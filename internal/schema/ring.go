package schema

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/fault"
)

// ArchivePartition is archive mode partition: published rows stay in the
// outbox, a ring of list partitions, until wal capture truncates their
// partition (see capture/wal).
const ArchivePartition = "partition"

// Ring is the shape of archive mode partition's outbox: Partitions list
// partitions, partition k holding the rows whose seq / Rows % Partitions
// is k, so that consecutive runs of Rows seqs fill one partition after the
// other.
type Ring struct {
	Partitions int
	Rows       int64
}

// Partition returns partition k of the ring outbox as `relay init` names
// it: the outbox's name followed by _p<k>, in its schema.
func (l Layout) Partition(k int) Table {
	return Table{Schema: l.Outbox.Schema, Name: derived(l.Outbox.Name, fmt.Sprintf("_p%d", k))}
}

// seqSequence is the sequence `relay init` creates for the ring outbox's
// seq column; its name is the one PostgreSQL gives an identity column's.
func (l Layout) seqSequence() Table {
	return Table{Schema: l.Outbox.Schema, Name: derived(l.Outbox.Name, "_"+l.Cols.Seq+"_seq")}
}

// CreateRingOutbox returns the statements creating the ring outbox when it
// is missing, without its partitions (see ringSteps): the seq column's
// sequence (CACHE 1, which the drain's claim needs), the table partitioned
// by LIST ((seq / Rows) % Partitions) with seq defaulting to the
// sequence's next value (identity columns on partitioned tables need
// PostgreSQL 17), and the sequence owned by the column, which lets
// pg_get_serial_sequence find it. The table has no primary key: a unique
// key of a partitioned table must contain the partition key's columns, and
// this one is an expression; each partition has unique indexes on id and
// seq instead.
func (l Layout) CreateRingOutbox(r Ring) []string {
	c, seq := l.Cols, l.seqSequence().Ident()
	return []string{
		fmt.Sprintf(`CREATE SEQUENCE IF NOT EXISTS %s CACHE 1`, seq),
		l.createOutbox("uuid NOT NULL", fmt.Sprintf("bigint NOT NULL DEFAULT nextval(%s)", Literal(seq)),
			fmt.Sprintf(" PARTITION BY LIST (((%s / %d) %% %d))", Q(c.Seq), r.Rows, r.Partitions)),
		fmt.Sprintf(`ALTER SEQUENCE %s OWNED BY %s.%s`, seq, l.Outbox.Ident(), Q(c.Seq)),
	}
}

// ringSteps returns the init steps of the ring outbox: the table, then each
// partition with its unique indexes on seq (named like the poll index) and
// on id, all plain: a partition is new, and CREATE INDEX CONCURRENTLY does
// not take a partitioned table.
func (l Layout) ringSteps(r Ring) []Step {
	steps := []Step{tableStep("outbox table", l.Outbox, l.CreateRingOutbox(r)...)}
	for k := range r.Partitions {
		p := l.Partition(k)
		ixs := []index{{table: p, suffix: "_relay_seq_idx", def: "(" + Q(l.Cols.Seq) + ")", unique: true},
			{table: p, suffix: "_id_idx", def: "(" + Q(l.Cols.ID) + ")", unique: true}}
		probe := fmt.Sprintf(`SELECT to_regclass(%s) IS NULL`, Literal(p.Ident()))
		create := []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES IN (%d)`, p.Ident(), l.Outbox.Ident(), k)}
		for _, ix := range ixs {
			probe += fmt.Sprintf(` OR to_regclass(%s) IS NULL`, Literal(sibling(p, ix.suffix)))
			create = append(create, ix.create(false))
		}
		steps = append(steps, Step{Object: fmt.Sprintf("partition %s of %s with unique indexes on %s and %s", p, l.Outbox, l.Cols.Seq, l.Cols.ID),
			Probe: probe, Create: create})
	}
	return steps
}

// InitRingSteps is InitSteps for archive mode partition: the ring outbox
// and its partitions (ringSteps) in place of the outbox table and the poll
// index, no notify trigger, then the dead-letter table as InitSteps.
func (l Layout) InitRingSteps(r Ring, types map[string]string) []Step {
	return append(l.ringSteps(r), l.commonSteps(false, ArchivePartition, types)...)
}

// RingInfo sets info.Partitions to the ring outbox's partitions
// (InspectRing's errors are its own).
func (l Layout) RingInfo(ctx context.Context, q Querier, r Ring, info *Info) error {
	parts, err := InspectRing(ctx, q, l, r)
	info.Partitions = parts
	return err
}

// RingPartitions returns info.Partitions, or when they are not known the
// quoted partitions of r as `relay init` names them.
func (l Layout) RingPartitions(r Ring, info Info) []string {
	if len(info.Partitions) > 0 {
		return info.Partitions
	}
	out := make([]string, r.Partitions)
	for k := range out {
		out[k] = l.Partition(k).Ident()
	}
	return out
}

// ringKey parses the partition key expression of a ring outbox as
// pg_get_expr prints it, e.g. ((seq / 1000) % (4)::bigint).
var ringKey = regexp.MustCompile(`^\(\("?(.+?)"? / '?(\d+)'?(?:::bigint)?\) % \(?'?(\d+)'?\)?(?:::bigint)?\)$`)

// ringBound parses a list partition's bound of one value.
var ringBound = regexp.MustCompile(`^FOR VALUES IN \('?(\d+)'?\)$`)

// InspectRing checks that the outbox is the ring of r, partitioned by LIST
// ((seq / r.Rows) % r.Partitions) with one partition for each value, and
// returns the partitions, quoted, in the order of their values. Anything
// else is a permanent error naming the table and what differs.
func InspectRing(ctx context.Context, q Querier, l Layout, r Ring) ([]string, error) {
	var kind, key string
	err := q.QueryRow(ctx, `SELECT c.relkind::text, coalesce(pg_get_expr(p.partexprs, p.partrelid), '')
		FROM pg_class c LEFT JOIN pg_partitioned_table p ON p.partrelid = c.oid AND p.partstrat = 'l'
		WHERE c.oid = $1::regclass`, l.Outbox.Ident()).Scan(&kind, &key)
	if err != nil {
		return nil, fmt.Errorf("inspect outbox table %s: %w", l.Outbox, err)
	}
	want := fmt.Sprintf("LIST ((%s / %d) %% %d)", Q(l.Cols.Seq), r.Rows, r.Partitions)
	if kind != "p" {
		return nil, fault.AsPermanent(fmt.Errorf("outbox table %s is not partitioned: archive.mode partition needs it partitioned by %s, as `relay init` creates it; "+
			"see \"Moving to archive.mode partition\" in docs/operations.md", l.Outbox, want))
	}
	m := ringKey.FindStringSubmatch(key)
	if m == nil || m[1] != l.Cols.Seq {
		return nil, fault.AsPermanent(fmt.Errorf("outbox table %s is partitioned by %q, not by %s: archive.mode partition needs the ring `relay init` creates; "+
			"see \"Moving to archive.mode partition\" in docs/operations.md", l.Outbox, key, want))
	}
	if m[2] != strconv.FormatInt(r.Rows, 10) || m[3] != strconv.Itoa(r.Partitions) {
		return nil, fault.AsPermanent(fmt.Errorf("outbox table %s is a ring of %s partitions of %s rows, but the config says archive.partitions %d and archive.partition_rows %d: set them to the table's",
			l.Outbox, m[3], m[2], r.Partitions, r.Rows))
	}
	rows, err := q.Query(ctx, `SELECT n.nspname, c.relname, coalesce(pg_get_expr(c.relpartbound, c.oid), '')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = $1::regclass`, l.Outbox.Ident())
	if err != nil {
		return nil, fmt.Errorf("inspect the partitions of %s: %w", l.Outbox, err)
	}
	type part struct {
		name, bound string
	}
	parts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (part, error) {
		var p part
		var nsp, rel string
		err := row.Scan(&nsp, &rel, &p.bound)
		p.name = pgx.Identifier{nsp, rel}.Sanitize()
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("inspect the partitions of %s: %w", l.Outbox, err)
	}
	out := make([]string, r.Partitions)
	for _, p := range parts {
		m := ringBound.FindStringSubmatch(p.bound)
		k := -1
		if m != nil {
			k, _ = strconv.Atoi(m[1])
		}
		if k < 0 || k >= r.Partitions || out[k] != "" {
			return nil, fault.AsPermanent(fmt.Errorf("outbox table %s has partition %s %s; the ring of archive.partitions %d has one partition for each value from 0 to %d",
				l.Outbox, p.name, p.bound, r.Partitions, r.Partitions-1))
		}
		out[k] = p.name
	}
	if k := slices.Index(out, ""); k >= 0 {
		return nil, fault.AsPermanent(fmt.Errorf("outbox table %s has %d partitions, but archive.partitions is %d (none for value %d): set it to the table's, or run `relay init` to add the missing ones",
			l.Outbox, len(parts), r.Partitions, k))
	}
	return out, nil
}

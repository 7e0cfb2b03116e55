package schema

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxrelay/relay/fault"
)

// Archive modes (archive.mode).
const (
	ArchiveDelete = "delete"
	ArchiveMark   = "mark"
	ArchiveMove   = "move"
)

// PublishedAt is the column archive mode mark sets on published rows.
const PublishedAt = "published_at"

// ArchiveByKey returns the statement that archives, per mode, the outbox
// rows whose column key is in $1 (an array of keyType, e.g. bigint for seq
// or uuid for id): delete them, set published_at, or move them to the
// archive table in the same statement.
func (l Layout) ArchiveByKey(mode, key, keyType string) string {
	return l.archive(mode, fmt.Sprintf("%s = ANY($1::%s[])", Q(key), keyType))
}

// ArchiveByKeyRange returns the statement of ArchiveByKey for keys $1 that
// lie between $2 and $3, their least and greatest. It reads that range of
// key's index once and looks each row up in $1 with a hash table (IS TRUE
// keeps the array out of the index condition), where ArchiveByKey descends
// the index once per key: less work when the keys fill most of the range.
func (l Layout) ArchiveByKeyRange(mode, key, keyType string) string {
	k := Q(key)
	return l.archive(mode, fmt.Sprintf("%s BETWEEN $2::%s AND $3::%s AND (%s = ANY($1::%s[])) IS TRUE", k, keyType, keyType, k, keyType))
}

// SeqArchive is the pair of statements archiving outbox rows by their seq
// values (see ArchiveByKey and ArchiveByKeyRange), for an outbox whose
// seq values are unique.
type SeqArchive struct{ list, rng string }

// ArchiveBySeq returns the statements archiving the outbox rows by seq
// per archive mode mode.
func (l Layout) ArchiveBySeq(mode string) SeqArchive {
	return SeqArchive{list: l.ArchiveByKey(mode, l.Cols.Seq, "bigint"), rng: l.ArchiveByKeyRange(mode, l.Cols.Seq, "bigint")}
}

// Of returns the statement archiving the rows of seqs, not empty, and its
// arguments: the range form when seqs fill at least a quarter of the range
// from their least to their greatest.
func (a SeqArchive) Of(seqs []int64) (string, []any) {
	lo, hi := slices.Min(seqs), slices.Max(seqs)
	if hi-lo < 4*int64(len(seqs)) {
		return a.rng, []any{seqs, lo, hi}
	}
	return a.list, []any{seqs}
}

// archive returns mode's statement archiving the outbox rows matching
// where.
func (l Layout) archive(mode, where string) string {
	switch mode {
	case ArchiveMark:
		return fmt.Sprintf(`UPDATE %s SET %s = now() WHERE %s`, l.Outbox.Ident(), Q(PublishedAt), where)
	case ArchiveMove:
		cols := l.Cols.Quoted("")
		return fmt.Sprintf(`WITH moved AS (DELETE FROM %s WHERE %s RETURNING %s)
			INSERT INTO %s (%s) SELECT %s FROM moved`, l.Outbox.Ident(), where, cols, l.Archive.Ident(), cols, cols)
	default:
		return fmt.Sprintf(`DELETE FROM %s WHERE %s`, l.Outbox.Ident(), where)
	}
}

// UnarchivedByID returns the statement selecting, as text, the ids among
// $1 (an array of idType, e.g. text[]::uuid) of the outbox rows that
// archive mode mode has not archived.
func (l Layout) UnarchivedByID(mode, idType string) string {
	id := Q(l.Cols.ID)
	return fmt.Sprintf(`SELECT %s::text FROM %s WHERE %s = ANY($1::%s[]) %s`,
		id, l.Outbox.Ident(), id, idType, l.Unpublished(mode, ""))
}

// Unpublished returns the condition, prefixed with AND, that keeps rows
// archive mode mark has not marked yet; empty for the other modes.
func (l Layout) Unpublished(mode, alias string) string {
	if mode != ArchiveMark {
		return ""
	}
	col := Q(PublishedAt)
	if alias != "" {
		col = alias + "." + col
	}
	return "AND " + col + " IS NULL"
}

// ArchiveDDL returns the statements archive mode needs (see archiveSteps),
// to run outside a transaction.
func (l Layout) ArchiveDDL(mode string, types map[string]string) []string {
	var stmts []string
	for _, s := range l.archiveSteps(mode, types) {
		stmts = append(stmts, s.Create...)
	}
	return stmts
}

// archiveSteps returns what archive mode needs: for mark the published_at
// column and partial indexes serving the poll query over unpublished rows
// and the pruning of published ones; for move the archive table with the
// outbox's column types (types as for CreateDeadLetter) and archived_at.
func (l Layout) archiveSteps(mode string, types map[string]string) []Step {
	switch mode {
	case ArchiveMark:
		return []Step{
			{Object: fmt.Sprintf("column %s of %s", PublishedAt, l.Outbox),
				Probe: fmt.Sprintf(`SELECT NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped)`,
					Literal(l.Outbox.Ident()), Literal(PublishedAt)),
				Create: []string{fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s timestamptz`, l.Outbox.Ident(), Q(PublishedAt))}},
			l.unpublishedIndex().step(),
			index{table: l.Outbox, suffix: "_relay_published_idx",
				def: fmt.Sprintf("(%s) WHERE %s IS NOT NULL", Q(PublishedAt), Q(PublishedAt))}.step(),
		}
	case ArchiveMove:
		create := l.createArchive(types)
		return append([]Step{tableStep("archive table", l.Archive, create[0]), l.archiveIndex().step()},
			l.orderColumnStep("archive table", l.Archive, types)...)
	}
	return nil
}

// createArchive returns the statements creating the archive table of
// archive mode move and its index (plain: the table is new).
func (l Layout) createArchive(types map[string]string) []string {
	return []string{
		fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n%s,\n  archived_at timestamptz NOT NULL DEFAULT now()\n)",
			l.Archive.Ident(), strings.Join(l.typedColumns(types), ",\n")),
		l.archiveIndex().create(false),
	}
}

// unpublishedIndex serves the poll query in archive mode mark.
func (l Layout) unpublishedIndex() index {
	return index{table: l.Outbox, suffix: "_relay_unpublished_idx",
		def: fmt.Sprintf("(%s) WHERE %s IS NULL", Q(l.Cols.Seq), Q(PublishedAt))}
}

func (l Layout) archiveIndex() index {
	return index{table: l.Archive, suffix: "_archived_at_idx", def: "(archived_at)"}
}

// PruneArchive returns the statement deleting at most $2 archived rows
// older than the interval $1, or "" when mode keeps no archive. Callers
// repeat it until it deletes fewer than $2, so no statement runs long.
func (l Layout) PruneArchive(mode string) string {
	table, col := l.Archive.Ident(), "archived_at"
	switch mode {
	case ArchiveMark:
		table, col = l.Outbox.Ident(), Q(PublishedAt)
	case ArchiveMove:
	default:
		return ""
	}
	return fmt.Sprintf(`DELETE FROM %s WHERE ctid = ANY(ARRAY(SELECT ctid FROM %s WHERE %s < now() - $1::interval LIMIT $2))`,
		table, table, col)
}

// EnsureArchive prepares archive mode: for move it creates the archive
// table when missing (no DDL when it exists; a role that may not create it
// gets a permanent error naming it and `relay init`); for mark it requires
// the published_at column that `relay init` adds (a permanent error naming
// it otherwise).
func EnsureArchive(ctx context.Context, q Querier, l Layout, mode string, info Info) error {
	switch mode {
	case ArchiveMark:
		if _, ok := info.Types[PublishedAt]; !ok {
			return fault.AsPermanent(fmt.Errorf("archive.mode mark needs column %s on %s: run `relay init`", PublishedAt, l.Outbox))
		}
	case ArchiveMove:
		if err := ensureTable(ctx, q, "archive table", l.Archive, l.createArchive(info.Types)); err != nil {
			return err
		}
		return ensureOrderColumn(ctx, q, l, "archive table", l.Archive, info.Types)
	}
	return nil
}

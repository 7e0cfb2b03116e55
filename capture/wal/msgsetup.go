package wal

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/schema"
)

// messagesMinVersion is the first PostgreSQL release (server_version_num)
// whose pgoutput sends logical decoding messages (option messages).
const messagesMinVersion = 140000

// checkMessagesVersion fails permanently when the server is older than
// PostgreSQL 14, whose pgoutput cannot send logical decoding messages.
func checkMessagesVersion(ctx context.Context, q schema.Querier) error {
	var num int
	var version string
	err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version)
	if err != nil {
		return fmt.Errorf("read the server's version: %w", err)
	}
	if num < messagesMinVersion {
		return fault.AsPermanent(fmt.Errorf("capture.wal.source: messages needs PostgreSQL 14 or later, and this server is %s: "+
			"set capture.wal.source to table, or upgrade", version))
	}
	return nil
}

// prepareMessages checks the database for the table-free outbox (wal_level,
// the replication privilege, PostgreSQL 14 or later, failover when asked
// for) and creates the dead-letter table and the publication when they are
// missing.
func prepareMessages(ctx context.Context, q schema.Querier, l schema.Layout, pub string, failover bool) error {
	if err := checkServer(ctx, q); err != nil {
		return err
	}
	if err := checkMessagesVersion(ctx, q); err != nil {
		return err
	}
	if err := checkFailover(ctx, q, failover); err != nil {
		return err
	}
	if err := schema.EnsureMessageDeadLetter(ctx, q, l); err != nil {
		return err
	}
	return ensureMessagePublication(ctx, q, pub)
}

// ensureMessagePublication creates publication pub, for no table, when it
// is missing: pgoutput needs one to stream, and messages do not depend on
// what it covers.
func ensureMessagePublication(ctx context.Context, q schema.Querier, pub string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, pub).Scan(&exists); err != nil {
		return fmt.Errorf("inspect publication %s: %w", pub, err)
	}
	if exists {
		return nil
	}
	if _, err := q.Exec(ctx, messagePublication(pub)); err != nil && !hasCode(err, codeDuplicateObject) {
		return permanentIfDenied(fmt.Errorf("publication %s does not exist and creating it failed (run `relay init`): %w", pub, err))
	}
	return nil
}

// messagePublication returns the statement creating publication pub for
// no table.
func messagePublication(pub string) string { return "CREATE PUBLICATION " + schema.Q(pub) }

// createMessageSlot creates the slot of the table-free outbox: no pending
// drain, as there is no table to drain.
func createMessageSlot(ctx context.Context, q schema.Querier, l schema.Layout, slot string, failover bool) error {
	_, err := q.Exec(ctx, l.CreateSlot(slot, failover).Create)
	if err != nil && !hasCode(err, codeDuplicateObject) {
		return permanentIfDenied(fmt.Errorf("create replication slot %s: %w", slot, err))
	}
	return nil
}

// startMessages is start for the table-free outbox: it recreates a missing
// or lost slot (the messages committed while it was missing are lost: there
// is no table to publish them from) and begins the stream.
func (s *Source) startMessages(ctx, term context.Context, slot slotInfo, timeline int64) error {
	pool, name := s.opts.Pool, s.opts.Slot
	if slot.lost {
		if err := dropSlot(ctx, pool, name); err != nil {
			return err
		}
	}
	if !slot.exists || slot.lost {
		reason := s.recreateReason(slot, timeline)
		if err := ensureMessagePublication(ctx, pool, s.opts.Publication); err != nil {
			return err
		}
		if err := createMessageSlot(ctx, pool, s.layout, name, s.opts.Failover); err != nil {
			return err
		}
		s.resumeAt = 0
		if reason != "" {
			s.recreated[reason].Add(1)
			s.log.Error("replication slot recreated: the outbox messages committed while it was missing or lost are lost for good, "+
				"as there is no outbox table to publish them from (see docs/operations.md)", "slot", name, "reason", reason)
		} else {
			s.log.Warn("replication slot created by relay run: outbox messages committed before it, if any, are lost; "+
				"create it with relay init before the application emits", "slot", name)
		}
		var err error
		if slot, err = inspectSlot(ctx, pool, name); err != nil {
			return err
		}
	}
	if timeline != s.timeline {
		s.resumeAt = 0
	}
	s.timeline = timeline
	if s.opts.Failover && !slot.failover {
		s.enableFailover(ctx)
	}
	var err error
	s.st, err = s.openStream(ctx, term, max(slot.confirmed, s.resumeAt))
	return err
}

// SetupMessages is Setup for the table-free outbox (capture.wal.source
// messages): it checks the server (wal_level, the replication privilege,
// PostgreSQL 14 or later) and creates the dead-letter table, the
// publication and the slot when they are missing, so that the slot exists
// before the application emits its first message. It is idempotent.
func SetupMessages(ctx context.Context, q table.Querier, tl table.Layout, slot, publication string, failover bool) error {
	l := schema.Layout(tl)
	if !slotName.MatchString(slot) {
		return fmt.Errorf("replication slot name %q must match %s", slot, slotName)
	}
	if err := prepareMessages(ctx, q, l, publication, failover); err != nil {
		return err
	}
	info, err := inspectSlot(ctx, q, slot)
	if err != nil || info.exists {
		return err
	}
	return createMessageSlot(ctx, q, l, slot, failover)
}

// SetupMessagesSQL returns the statements SetupMessages runs, for `relay
// init --dry-run`.
func SetupMessagesSQL(tl table.Layout, slot, publication string, failover bool) []string {
	l := schema.Layout(tl)
	stmts := l.CreateDeadLetter(l.MessageInfo().Types)
	return append(stmts, "-- publication "+publication+", when missing:\n"+messagePublication(publication),
		"-- replication slot "+slot+", when missing:\n"+l.CreateSlot(slot, failover).Create)
}

// CheckMessages is Check for the table-free outbox: wal_level, the
// replication privilege, PostgreSQL 14 or later, a replication connection,
// the publication and the slot.
func CheckMessages(ctx context.Context, pool *pgxpool.Pool, tl table.Layout, slot, publication string, failover bool) []Finding {
	out := Check(ctx, pool, tl, slot, publication, failover)
	for i := range out {
		if out[i].What == "publication "+publication {
			out[i].Err = checkMessagePublication(ctx, pool, publication)
			out[i].Fix = "run `relay init` (or `relay run` as a role that may create it)"
		}
	}
	return append(out, Finding{What: "capture.wal.source messages: PostgreSQL 14 or later", Err: checkMessagesVersion(ctx, pool),
		Fix: "set capture.wal.source to table, or upgrade PostgreSQL"})
}

func checkMessagePublication(ctx context.Context, q schema.Querier, pub string) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, pub).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return errNoPublication
	}
	return nil
}

// MessageWarnings reports, for `relay check`, the risks of the table-free
// outbox: messages committed while the slot is missing are lost for good,
// so a slot that a failover would lose is a warning.
func MessageWarnings(ctx context.Context, q table.Querier, slot string) []Finding {
	info, err := inspectSlot(ctx, q, slot)
	if err != nil || (info.exists && info.failover) {
		return nil
	}
	return []Finding{{What: "replication slot " + slot + " of the table-free outbox",
		Err: errors.New("is not a failover slot: messages committed while the slot is missing (a promoted standby without it, a dropped or lost slot) are lost for good, as there is no outbox table to publish them from"),
		Fix: "on PostgreSQL 17 set capture.wal.failover: true with sync_replication_slots on the standbys; bound max_slot_wal_keep_size generously and alert on the slot's lag (docs/operations.md)"}}
}

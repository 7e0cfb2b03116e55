package wal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/relay/internal/outage"
	"github.com/outboxrelay/relay/internal/schema"
)

// SlotState is what the source last observed of its replication slot and
// of the WAL it holds back. Sizes are bytes; -1 means unknown.
type SlotState struct {
	// Sampled is false until the first observation succeeded.
	Sampled bool
	// Exists reports whether the slot exists; the other fields but
	// KeepSize are zero values or -1 while it does not.
	Exists bool
	// Active reports whether a walsender streams from the slot (this
	// relay or another process).
	Active bool
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost; "missing" while the slot does not exist.
	WALStatus string
	// RetainedBytes is the WAL the server keeps for the slot: from its
	// restart_lsn to the server's current position.
	RetainedBytes int64
	// LagBytes is how far the slot's confirmed_flush_lsn is behind the
	// server's current position.
	LagBytes int64
	// SafeWALSize is pg_replication_slots.safe_wal_size: how much WAL
	// may still be written before the slot is lost; -1 when
	// max_slot_wal_keep_size is unlimited.
	SafeWALSize int64
	// KeepSize is the server's max_slot_wal_keep_size; -1 when unlimited.
	KeepSize int64
	// Failover reports whether the slot is synchronized to standbys
	// (PostgreSQL 17 and later).
	Failover bool
	// StalledFor is how long the slot's confirmed_flush_lsn has not moved
	// while the outbox held unpublished rows; 0 when it moved at the last
	// observation or the outbox was empty.
	StalledFor time.Duration
}

// Stall recovery steps, the label values of StallRecoveries.
const (
	// StallReconnect: the stream was reconnected.
	StallReconnect = "reconnect"
	// StallDrain: the outbox was published from the table, then
	// streaming resumed.
	StallDrain = "drain"
)

// StallActions lists the steps of StallRecoveries.
var StallActions = []string{StallReconnect, StallDrain}

// Slot returns the slot's last observed state, refreshed every
// Options.GuardInterval by every relay on the table, leading or not. It is
// safe for concurrent use.
func (s *Source) Slot() SlotState {
	s.guard.mu.Lock()
	defer s.guard.mu.Unlock()
	return s.guard.state
}

// StallRecoveries returns how many times this source took step action (one
// of StallActions) because its slot stalled. It is safe for concurrent use.
func (s *Source) StallRecoveries(action string) int64 {
	switch action {
	case StallReconnect:
		return s.guard.reconnects.Load()
	case StallDrain:
		return s.guard.drains.Load()
	}
	return 0
}

// guard observes the slot, and when this relay leads, recovers from a
// stall: the slot's confirmed position does not move while the outbox
// holds rows and this relay holds none of them. The first time it
// reconnects the stream; when that did not help, it publishes the outbox
// from the table (the drain of rows older than the slot) and then streams
// again. state is guarded by mu, the counters are atomic, and the other
// fields belong to the goroutine running watchSlot.
type guard struct {
	mu    sync.Mutex
	state SlotState

	query      string
	confirmed  string      // confirmed_flush_lsn at the last observation
	movedAt    time.Time   // when confirmed last moved or the outbox was empty
	idleSince  time.Time   // since when the stall was observed with nothing of it held by this relay
	steps      int         // recovery steps since confirmed last moved
	warnedKeep bool        // the unlimited max_slot_wal_keep_size was logged
	fails      *outage.Log // failed observations, set by the source

	kick chan struct{} // signalled to observe at once, e.g. when streaming begins

	reconnects, drains atomic.Int64
}

// newGuard returns the slot's guard; with messages (the table-free
// outbox) there is no outbox table whose rows could show a stall. With
// lacking (an outbox without seq, see schema.Info.Missing) a pending drain
// covers every row.
func newGuard(l schema.Layout, archiveMode string, messages, lacking bool) *guard {
	rows := fmt.Sprintf(`EXISTS (SELECT 1 FROM %s WHERE %s > coalesce((SELECT drain_to FROM %s WHERE slot = $1), 0) %s)`,
		l.Outbox.Ident(), schema.Q(l.Cols.Seq), l.DrainTable().Ident(), l.Unpublished(archiveMode, ""))
	switch {
	case messages:
		rows = "false"
	case archiveMode == schema.ArchivePartition:
		rows = "coalesce(pg_current_wal_lsn() > s.confirmed_flush_lsn, false)"
	case lacking:
		rows = fmt.Sprintf(`(EXISTS (SELECT 1 FROM %s WHERE true %s) AND NOT EXISTS (SELECT 1 FROM %s WHERE slot = $1))`,
			l.Outbox.Ident(), l.Unpublished(archiveMode, ""), l.DrainTable().Ident())
	}
	return &guard{state: SlotState{RetainedBytes: -1, LagBytes: -1, SafeWALSize: -1, KeepSize: -1}, kick: make(chan struct{}, 1),
		query: fmt.Sprintf(`SELECT s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, 'missing'),
		  coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, -1),
		  coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, -1),
		  coalesce(s.safe_wal_size, -1), coalesce((to_jsonb(s)->>'failover')::bool, false),
		  coalesce(s.confirmed_flush_lsn::text, ''),
		  (SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE pg_size_bytes(setting || coalesce(unit, '')) END
		     FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
		  %s
		FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, rows)}
}

// read reads the slot's state, its confirmed position and whether the
// outbox holds unpublished rows that the slot's pending drain does not
// cover (those left for held aggregates wait for the drain, not the slot).
func (g *guard) read(ctx context.Context, q schema.Querier, slot string) (st SlotState, confirmed string, rows bool, err error) {
	st.Sampled = true
	err = q.QueryRow(ctx, g.query, slot).Scan(&st.Exists, &st.Active, &st.WALStatus,
		&st.RetainedBytes, &st.LagBytes, &st.SafeWALSize, &st.Failover, &confirmed, &st.KeepSize, &rows)
	if err != nil {
		return SlotState{}, "", false, fmt.Errorf("observe replication slot %s: %w", slot, err)
	}
	return st, confirmed, rows, nil
}

// watchSlot observes the slot every GuardInterval, and when streaming
// begins, until ctx ends.
func (s *Source) watchSlot(ctx context.Context) {
	t := time.NewTicker(s.opts.GuardInterval)
	defer t.Stop()
	for {
		err := s.observeSlot(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			s.guard.fails.Fail(err, "slot", s.opts.Slot)
		default:
			s.guard.fails.OK()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.guard.kick:
		}
	}
}

// observeSlot reads the slot's state with one short query and acts on a
// stall.
func (s *Source) observeSlot(ctx context.Context) error {
	g := &s.guard
	st, confirmed, rows, err := g.read(ctx, s.opts.Pool, s.opts.Slot)
	if err != nil {
		return err
	}
	now := time.Now()
	g.mu.Lock()
	if confirmed != g.confirmed {
		g.steps = 0
	}
	if !st.Exists || !rows || confirmed != g.confirmed {
		g.movedAt = now
	}
	g.confirmed = confirmed
	st.StalledFor = now.Sub(g.movedAt)
	g.state = st
	warnKeep := st.KeepSize < 0 && !g.warnedKeep
	g.warnedKeep = g.warnedKeep || warnKeep
	g.mu.Unlock()
	if warnKeep {
		s.log.Warn("max_slot_wal_keep_size is unlimited: if the relay stops streaming, the slot keeps WAL until the disk is full; "+
			"see `relay check` for the statement to run", "slot", s.opts.Slot)
	}
	s.healStall(now, st.Exists && st.StalledFor > 0)
	return nil
}

// healStall takes the next recovery step once the slot stalled for
// StallAfter while this relay led and held none of the outbox's rows. A
// relay that holds rows (a broker outage, a slow publish) is not stalled:
// the slot waits for it.
func (s *Source) healStall(now time.Time, stalled bool) {
	g := &s.guard
	if !stalled || !s.lead.leading() || s.draining.Load() || s.holding() {
		g.idleSince = time.Time{}
		return
	}
	if g.idleSince.IsZero() {
		g.idleSince = now
	}
	stalledFor := now.Sub(g.idleSince)
	if stalledFor < s.opts.StallAfter {
		return
	}
	g.idleSince = now
	g.steps++
	st := s.cur.Load()
	if g.steps == 1 {
		g.reconnects.Add(1)
		s.log.Warn("replication slot stalled: its confirmed position has not moved while the outbox holds rows; reconnecting the stream",
			"slot", s.opts.Slot, "stalled_for", stalledFor)
	} else {
		g.drains.Add(1)
		s.fallback.Store(true)
		s.log.Warn("replication slot still stalled after reconnecting; publishing the outbox from the table, then streaming again",
			"slot", s.opts.Slot, "stalled_for", stalledFor)
	}
	if st != nil {
		st.fail(errStalled)
	}
	if cancel := s.opening.Load(); cancel != nil {
		(*cancel)(errStalled)
	}
}

var errStalled = errors.New("replication slot stalled")

// live returns the current stream, or nil when there is none or it ended.
func (s *Source) live() *stream {
	st := s.cur.Load()
	if st == nil {
		return nil
	}
	select {
	case <-st.done:
		return nil
	default:
		return st
	}
}

// holding reports whether the current stream holds rows: handed out and
// not archived yet, or received and not handed out.
func (s *Source) holding() bool {
	st := s.live()
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.open.rows() > 0 || len(st.inflight) > 0
}

// recordDrain records a pending drain of every row in the outbox now, so
// that start publishes them from the table before streaming; a crash
// before the drain ends leaves it pending for the next start.
func recordDrain(ctx context.Context, q schema.Querier, l schema.Layout, slot string) error {
	c := l.CreateSlot(slot, false)
	for _, stmt := range []string{c.RecordDrain, c.FillDrain} {
		if _, err := q.Exec(ctx, stmt); err != nil {
			return permanentIfDenied(fmt.Errorf("record a drain of the outbox for stalled slot %s: %w", slot, err))
		}
	}
	return nil
}

package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/redact"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
)

// ErrUnhealthy is returned by Status when it found a problem.
var ErrUnhealthy = errors.New("unhealthy")

// StatusOptions vary relay status.
type StatusOptions struct {
	// JSON prints the report as one JSON object instead of text.
	JSON bool
	// Endpoint is the base URL of a running relay's HTTP server; default
	// the one http.listen names (a wildcard host on localhost), none when
	// http.listen is empty.
	Endpoint string
	// MaxAge is how old the oldest unpublished event may be before the
	// relay counts as unhealthy. Default DefaultStatusMaxAge.
	MaxAge time.Duration
}

// DefaultStatusMaxAge is StatusOptions.MaxAge's default, the age at which
// deploy/alerts.yaml's RelayOldestUnpublishedEventOld fires.
const DefaultStatusMaxAge = 5 * time.Minute

// backlogCap is the most unpublished rows relay status counts.
const backlogCap = 1_000_000

// statusTimeout bounds the database work of relay status.
const statusTimeout = 30 * time.Second

// statusReport is what relay status prints. Every string that comes from
// row data, the server or a running relay is made printable first.
type statusReport struct {
	Healthy     bool               `json:"healthy"`
	Problems    []string           `json:"problems"`
	Warnings    []string           `json:"warnings"`
	Mode        string             `json:"mode"`
	Outbox      outboxStatus       `json:"outbox"`
	Slot        *slotStatus        `json:"slot,omitempty"`
	Relays      []relayStatus      `json:"relays"`
	Partitions  *partitionStatus   `json:"partitions,omitempty"`
	DeadLetters []deadLetterStatus `json:"dead_letters"`
	Live        *liveReport        `json:"live,omitempty"`
}

type outboxStatus struct {
	Table string `json:"table"`
	// Unpublished counts the rows not yet published, at most backlogCap.
	Unpublished int64 `json:"unpublished"`
	// Capped is true when there are more than Unpublished.
	Capped           bool    `json:"unpublished_capped"`
	OldestAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
}

type slotStatus struct {
	Name               string `json:"name"`
	Exists             bool   `json:"exists"`
	Active             bool   `json:"active"`
	WALStatus          string `json:"wal_status"`
	RetainedBytes      int64  `json:"retained_wal_bytes"`
	SafeWALSizeBytes   int64  `json:"safe_wal_size_bytes"`
	MaxSlotWALKeepSize int64  `json:"max_slot_wal_keep_size_bytes"`
	ConfirmedLagBytes  int64  `json:"confirmed_lag_bytes"`
	ConfirmedFlushLSN  string `json:"confirmed_flush_lsn"`
	RestartLSN         string `json:"restart_lsn"`
	ServerWALPosition  string `json:"server_wal_lsn"`
}

// relayStatus is one relay running on the outbox.
type relayStatus struct {
	PID    int32     `json:"pid"`
	Client string    `json:"client"`
	Since  time.Time `json:"since"`
	// Role is "streaming" or "standby" in wal mode, "polling" in poll mode.
	Role       string  `json:"role"`
	Partitions []int32 `json:"partitions,omitempty"`
}

type partitionStatus struct {
	Total   int     `json:"total"`
	Unowned []int32 `json:"unowned"`
}

type deadLetterStatus struct {
	ErrorClass   string    `json:"error_class"`
	Count        int64     `json:"count"`
	LastFailedAt time.Time `json:"last_failed_at"`
}

// liveReport is what the running relay at URL answered.
type liveReport struct {
	URL   string `json:"url"`
	Error string `json:"error,omitempty"`
	*liveStatus
}

// Status prints the state of cfg's relays to w: the capture mode, the
// outbox backlog, the replication slot (wal), the relays on the outbox and
// who stands by (wal) or owns which partition (poll), the dead letters by
// error class, and what a running relay's GET /status says about its
// destinations. It only reads, in a read-only transaction, and needs no
// more than relay run's grants. It returns ErrUnhealthy when it found a
// problem, after printing the report.
func Status(ctx context.Context, cfg *config.Config, opts StatusOptions, w io.Writer) error {
	if opts.MaxAge <= 0 {
		opts.MaxAge = DefaultStatusMaxAge
	}
	if opts.Endpoint == "" {
		opts.Endpoint = endpointOf(cfg.HTTP.Listen)
	}
	rep := &statusReport{Mode: cfg.Capture.Mode, Problems: []string{}, Warnings: []string{}, Relays: []relayStatus{},
		DeadLetters: []deadLetterStatus{}}
	pool, err := connect(ctx, cfg.Postgres, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	dbctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	err = pgx.BeginTxFunc(dbctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return rep.read(dbctx, tx, cfg)
	})
	if err != nil {
		return err
	}
	if opts.Endpoint != "" {
		rep.readLive(ctx, opts.Endpoint)
	}
	rep.judge(cfg, opts.MaxAge)
	if opts.JSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.print(w)
	}
	if !rep.Healthy {
		return ErrUnhealthy
	}
	return nil
}

// read fills the report from the database.
func (rep *statusReport) read(ctx context.Context, tx pgx.Tx, cfg *config.Config) error {
	l := layoutOf(cfg)
	rep.Outbox.Table = l.Outbox.String()
	if _, err := schema.Inspect(ctx, tx, l); err != nil {
		if errors.Is(err, schema.ErrNoOutbox) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("outbox table %s does not exist: run relay init", l.Outbox))
			return nil
		}
		return err
	}
	if err := rep.readOutbox(ctx, tx, l, cfg.Archive.Mode); err != nil {
		return err
	}
	if cfg.Capture.Mode == "wal" {
		if err := rep.readSlot(ctx, tx, cfg.Capture.WAL.Slot); err != nil {
			return err
		}
	}
	if err := rep.readRelays(ctx, tx, l, cfg); err != nil {
		return err
	}
	return rep.readDeadLetters(ctx, tx, l)
}

func (rep *statusReport) readOutbox(ctx context.Context, tx pgx.Tx, l schema.Layout, archiveMode string) error {
	err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s WHERE true %s LIMIT %d) t`,
		l.Outbox.Ident(), l.Unpublished(archiveMode, ""), backlogCap+1)).Scan(&rep.Outbox.Unpublished)
	if err != nil {
		return fmt.Errorf("count the outbox backlog: %w", err)
	}
	if rep.Outbox.Unpublished > backlogCap {
		rep.Outbox.Unpublished, rep.Outbox.Capped = backlogCap, true
	}
	if err := tx.QueryRow(ctx, newBacklogAge(l, archiveMode).query).Scan(&rep.Outbox.OldestAgeSeconds); err != nil {
		return fmt.Errorf("read the oldest unpublished event: %w", err)
	}
	return nil
}

func (rep *statusReport) readSlot(ctx context.Context, tx pgx.Tx, slot string) error {
	s := &slotStatus{Name: slot}
	rep.Slot = s
	err := tx.QueryRow(ctx, `SELECT s.slot_name IS NOT NULL, coalesce(s.active, false), coalesce(s.wal_status, 'missing'),
		  coalesce((pg_current_wal_lsn() - s.restart_lsn)::bigint, -1),
		  coalesce((pg_current_wal_lsn() - s.confirmed_flush_lsn)::bigint, -1),
		  coalesce(s.safe_wal_size, -1),
		  (SELECT CASE WHEN setting::bigint < 0 THEN -1 ELSE pg_size_bytes(setting || coalesce(unit, '')) END
		     FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
		  coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.restart_lsn::text, ''), pg_current_wal_lsn()::text
		FROM (SELECT 1) one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).Scan(
		&s.Exists, &s.Active, &s.WALStatus, &s.RetainedBytes, &s.ConfirmedLagBytes, &s.SafeWALSizeBytes,
		&s.MaxSlotWALKeepSize, &s.ConfirmedFlushLSN, &s.RestartLSN, &s.ServerWALPosition)
	if err != nil {
		return fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	return nil
}

// readRelays lists the relays on the outbox. In wal mode the one whose
// lock session also holds the leader lock (an exclusive advisory lock with
// objid 0) streams; in poll mode the exclusive advisory locks of a relay's
// lock session are its partition leases.
func (rep *statusReport) readRelays(ctx context.Context, tx pgx.Tx, l schema.Layout, cfg *config.Config) error {
	sessions, err := schema.Relays(ctx, tx, l)
	if err != nil {
		return err
	}
	total := cfg.Capture.Poll.Partitions
	owned := map[int32]bool{}
	for _, s := range sessions {
		r := relayStatus{PID: s.PID, Client: rowtext.Clean(s.Client, 100), Since: s.Since.UTC()}
		switch {
		case cfg.Capture.Mode == "poll":
			r.Role = "polling"
			for _, p := range s.Exclusive {
				if p >= 0 && int(p) < total {
					r.Partitions = append(r.Partitions, p)
					owned[p] = true
				}
			}
		case slices.Contains(s.Exclusive, 0):
			r.Role = "streaming"
		default:
			r.Role = "standby"
		}
		rep.Relays = append(rep.Relays, r)
	}
	if cfg.Capture.Mode == "poll" {
		rep.Partitions = &partitionStatus{Total: total, Unowned: []int32{}}
		for p := range int32(total) {
			if !owned[p] {
				rep.Partitions.Unowned = append(rep.Partitions.Unowned, p)
			}
		}
	}
	return nil
}

func (rep *statusReport) readDeadLetters(ctx context.Context, tx pgx.Tx, l schema.Layout) error {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, l.DeadLetter.Ident()).Scan(&exists); err != nil || !exists {
		return err
	}
	rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT coalesce(error_class, ''), count(*), max(coalesce(last_failed_at, dead_lettered_at))
		FROM %s GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 20`, l.DeadLetter.Ident()))
	if err != nil {
		return fmt.Errorf("count dead letters in %s: %w", l.DeadLetter, err)
	}
	rep.DeadLetters, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (deadLetterStatus, error) {
		var d deadLetterStatus
		err := row.Scan(&d.ErrorClass, &d.Count, &d.LastFailedAt)
		d.ErrorClass, d.LastFailedAt = rowtext.Clean(d.ErrorClass, 100), d.LastFailedAt.UTC()
		return d, err
	})
	if err != nil {
		return fmt.Errorf("count dead letters in %s: %w", l.DeadLetter, err)
	}
	return nil
}

// readLive asks the running relay at base for its state.
func (rep *statusReport) readLive(ctx context.Context, base string) {
	rep.Live = &liveReport{URL: rowtext.Clean(redact.String(base), 200)}
	st, err := fetchLive(ctx, strings.TrimSuffix(base, "/"))
	if err != nil {
		rep.Live.Error = rowtext.Clean(redact.String(err.Error()), 300)
		return
	}
	st.DatabaseError = rowtext.Clean(st.DatabaseError, 300)
	for i, d := range st.Broken {
		st.Broken[i] = liveDestination{Name: rowtext.Clean(d.Name, 200), Since: d.Since.UTC(), Error: rowtext.Clean(d.Error, 300)}
	}
	rep.Live.liveStatus = &st
}

// judge sets Healthy, Problems and Warnings.
func (rep *statusReport) judge(cfg *config.Config, maxAge time.Duration) {
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }
	warn := func(format string, args ...any) { rep.Warnings = append(rep.Warnings, fmt.Sprintf(format, args...)) }
	if len(rep.Problems) > 0 { // no outbox table: nothing else was read
		return
	}
	if age := time.Duration(rep.Outbox.OldestAgeSeconds * float64(time.Second)); age > maxAge {
		problem("the oldest unpublished event is %s old (more than %s)", age.Round(time.Second), maxAge)
	}
	if len(rep.Relays) == 0 {
		problem("no relay runs on outbox %s", rep.Outbox.Table)
	}
	if s := rep.Slot; s != nil {
		switch {
		case !s.Exists:
			problem("replication slot %s does not exist (relay run creates it; rows are published from the table meanwhile)", s.Name)
		case s.WALStatus == "unreserved" || s.WALStatus == "lost":
			problem("replication slot %s has wal_status %s", s.Name, s.WALStatus)
		case s.MaxSlotWALKeepSize > 0 && s.SafeWALSizeBytes*4 < s.MaxSlotWALKeepSize:
			warn("replication slot %s has %s of max_slot_wal_keep_size left", s.Name, bytesText(s.SafeWALSizeBytes))
		}
		if len(rep.Relays) > 0 && !slices.ContainsFunc(rep.Relays, func(r relayStatus) bool { return r.Role == "streaming" }) {
			problem("no relay streams: every relay on the outbox stands by")
		}
	}
	if p := rep.Partitions; p != nil && len(rep.Relays) > 0 && len(p.Unowned) > 0 {
		problem("%d of %d partitions have no owner (a relay just joined or left: partitions are rebalanced within seconds)", len(p.Unowned), p.Total)
	}
	if n := sumDeadLetters(rep.DeadLetters); n > 0 {
		warn("%d dead letters in %s: see relay dlq list", n, cfg.DeadLetter.Table)
	}
	if l := rep.Live; l != nil {
		switch {
		case l.Error != "":
			problem("the relay at %s does not answer: %s", l.URL, l.Error)
		case l.DatabaseError != "":
			problem("the database refuses the relay at %s: %s", l.URL, l.DatabaseError)
		case !l.Capturing:
			problem("the relay at %s cannot capture (is Postgres reachable?)", l.URL)
		case len(l.Broken) > 0:
			problem("the relay at %s holds the events of %d broken destination(s)", l.URL, len(l.Broken))
		}
	}
	rep.Healthy = len(rep.Problems) == 0
}

func sumDeadLetters(ds []deadLetterStatus) int64 {
	var n int64
	for _, d := range ds {
		n += d.Count
	}
	return n
}

// print writes the report as text.
func (rep *statusReport) print(w io.Writer) {
	verdict := "HEALTHY"
	if !rep.Healthy {
		verdict = "UNHEALTHY"
	}
	fmt.Fprintf(w, "relay status: %s\n", verdict)
	fmt.Fprintf(w, "mode          %s\n", rep.Mode)
	o := rep.Outbox
	more := ""
	if o.Capped {
		more = "more than "
	}
	fmt.Fprintf(w, "outbox        %s: %s%d unpublished, oldest %s old\n", o.Table, more, o.Unpublished,
		time.Duration(o.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond))
	if s := rep.Slot; s != nil {
		switch {
		case !s.Exists:
			fmt.Fprintf(w, "slot          %s: missing\n", s.Name)
		default:
			limit := "unlimited max_slot_wal_keep_size"
			if s.MaxSlotWALKeepSize > 0 {
				limit = fmt.Sprintf("%s left of max_slot_wal_keep_size %s", bytesText(max(s.SafeWALSizeBytes, 0)), bytesText(s.MaxSlotWALKeepSize))
			}
			fmt.Fprintf(w, "slot          %s: %s, wal_status %s, retained WAL %s (%s), confirmed %s behind\n", s.Name,
				map[bool]string{true: "active", false: "inactive"}[s.Active], s.WALStatus, bytesText(s.RetainedBytes), limit,
				bytesText(s.ConfirmedLagBytes))
		}
	}
	fmt.Fprintf(w, "relays        %d\n", len(rep.Relays))
	for _, r := range rep.Relays {
		fmt.Fprintf(w, "  pid %-7d %-22s since %s  %s", r.PID, r.Client, r.Since.Format(time.RFC3339), r.Role)
		if rep.Partitions != nil {
			fmt.Fprintf(w, ", partitions %s", ranges(r.Partitions))
		}
		fmt.Fprintln(w)
	}
	if p := rep.Partitions; p != nil {
		fmt.Fprintf(w, "partitions    %d, %d unowned %s\n", p.Total, len(p.Unowned), ranges(p.Unowned))
	}
	fmt.Fprintf(w, "dead letters  %d\n", sumDeadLetters(rep.DeadLetters))
	for _, d := range rep.DeadLetters {
		fmt.Fprintf(w, "  %-14s %d, last %s\n", d.ErrorClass, d.Count, d.LastFailedAt.Format(time.RFC3339))
	}
	if l := rep.Live; l != nil {
		if l.Error != "" {
			fmt.Fprintf(w, "running relay %s: not answering: %s\n", l.URL, l.Error)
		} else {
			fmt.Fprintf(w, "running relay %s: capturing %v, destinations ready %v, %d broken; %d published, %d dead-lettered, %d retries since start\n",
				l.URL, l.Capturing, l.Ready, len(l.Broken), l.Published, l.DeadLettered, l.Retries)
			for _, d := range l.Broken {
				fmt.Fprintf(w, "  destination %s broken since %s: %s\n", d.Name, d.Since.Format(time.RFC3339), d.Error)
			}
		}
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM  %s\n", p)
	}
	for _, x := range rep.Warnings {
		fmt.Fprintf(w, "WARN     %s\n", x)
	}
}

// bytesText formats n bytes with a binary unit.
func bytesText(n int64) string {
	if n < 0 {
		return "unknown"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ranges formats sorted partitions as "0-3,7" ("none" when empty).
func ranges(ps []int32) string {
	if len(ps) == 0 {
		return "none"
	}
	var parts []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(int(ps[i])))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

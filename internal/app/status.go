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
	"sync"
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
	// Endpoints are base URLs of running relays' HTTP servers to ask besides
	// the relays the database lists. When the database cannot be read,
	// relay status asks them (by default the one http.listen names, a
	// wildcard host on localhost) and the relays they last saw (peers).
	Endpoints []string
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
	Database    databaseStatus     `json:"database"`
	Outbox      *outboxStatus      `json:"outbox,omitempty"`
	Slot        *slotStatus        `json:"slot,omitempty"`
	Relays      []relayStatus      `json:"relays"`
	Partitions  *partitionStatus   `json:"partitions,omitempty"`
	DeadLetters []deadLetterStatus `json:"dead_letters"`
}

// databaseStatus says whether relay status could read the database.
type databaseStatus struct {
	// Reachable is false when relay status could not connect.
	Reachable bool `json:"reachable"`
	// Error is why the database could not be read, password redacted.
	Error string `json:"error,omitempty"`
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

// How relay status found a relay (relayStatus.FoundBy).
const (
	foundInDatabase = "database" // its capture configuration lock session
	foundAsPeer     = "peer"     // the peers another relay last read
	foundAtEndpoint = "endpoint" // --endpoint, or http.listen
)

// relayStatus is one relay: what the database says about it, when it
// could be read, and what the relay says itself (Live).
type relayStatus struct {
	// Address is the HTTP address the relay advertises (its answer's, else
	// its application_name's); empty when it advertises none.
	Address string `json:"address"`
	FoundBy string `json:"found_by"`
	// BackendPID is the PostgreSQL backend pid of the relay's lock session,
	// not the relay's own (that is Live.PID).
	BackendPID int32      `json:"backend_pid,omitempty"`
	Client     string     `json:"client,omitempty"`
	Since      *time.Time `json:"connected_since,omitempty"`
	// Role is "streaming" or "standby" in wal mode, "polling" in poll mode.
	Role       string      `json:"role,omitempty"`
	Partitions []int32     `json:"partitions,omitempty"`
	Live       *liveReport `json:"live,omitempty"`
}

// name returns how the report names r: its address, else its backend pid.
func (r relayStatus) name() string {
	if r.Address != "" {
		return r.Address
	}
	return fmt.Sprintf("with postgres backend pid %d", r.BackendPID)
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

// Status prints the state of cfg's relays to w, the same from any host:
// the capture mode, whether the database could be read, the outbox
// backlog, the replication slot (wal; in poll mode one left by an earlier
// wal run), every relay on the outbox with who streams and who stands by
// (wal) or owns which partition (poll) and what each says about itself
// and its destinations on GET /status, and the dead letters by error
// class. It finds the relays through the database (see advertised); when
// the database cannot be read it says so and asks opts.Endpoints and the
// relays they last saw. It only reads, in a read-only transaction, and
// needs no more than relay run's grants. It returns ErrUnhealthy when it
// found a problem, after printing the report.
func Status(ctx context.Context, cfg *config.Config, opts StatusOptions, w io.Writer) error {
	if opts.MaxAge <= 0 {
		opts.MaxAge = DefaultStatusMaxAge
	}
	rep := newStatusReport(cfg.Capture.Mode)
	if err := rep.readDatabase(ctx, cfg); err != nil {
		if IsUsage(err) || ctx.Err() != nil {
			return err
		}
		reachable := rep.Database.Reachable
		rep = newStatusReport(cfg.Capture.Mode) // nothing half read
		rep.Database = databaseStatus{Reachable: reachable, Error: rowtext.Clean(redact.String(err.Error()), 500)}
	}
	rep.askRelays(ctx, cfg, opts.Endpoints)
	if err := ctx.Err(); err != nil {
		return err
	}
	rep.judge(cfg, opts.MaxAge)
	if opts.JSON {
		if err := writeJSON(w, rep); err != nil {
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

// newStatusReport returns an empty report of capture mode mode.
func newStatusReport(mode string) *statusReport {
	return &statusReport{Mode: mode, Problems: []string{}, Warnings: []string{}, Relays: []relayStatus{},
		DeadLetters: []deadLetterStatus{}}
}

// writeJSON writes v to w as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// readDatabase fills the report from the database, in one read-only
// transaction.
func (rep *statusReport) readDatabase(ctx context.Context, cfg *config.Config) error {
	pool, err := connect(ctx, cfg.Postgres, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep.Database.Reachable = true
	dbctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	return pgx.BeginTxFunc(dbctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return rep.read(dbctx, tx, cfg)
	})
}

// read fills the report from the database.
func (rep *statusReport) read(ctx context.Context, tx pgx.Tx, cfg *config.Config) error {
	l := layoutOf(cfg)
	rep.Outbox = &outboxStatus{Table: l.Outbox.String()}
	if cfg.Capture.WAL.Messages() {
		return rep.readTableFree(ctx, tx, l, cfg)
	}
	info, err := schema.InspectFor(ctx, tx, l, cfg.Capture.Mode == "wal")
	if err != nil {
		if errors.Is(err, schema.ErrNoOutbox) {
			rep.Problems = append(rep.Problems, fmt.Sprintf("outbox table %s does not exist: run relay init", l.Outbox))
			return nil
		}
		return err
	}
	// The ring outbox of archive mode partition holds published rows until
	// their partition is truncated: its backlog is the slot's lag, as with
	// the table-free outbox.
	if cfg.Archive.Mode != schema.ArchivePartition {
		if err := rep.readOutbox(ctx, tx, l, cfg.Archive.Mode, info); err != nil {
			return err
		}
	}
	if err := rep.readSlot(ctx, tx, cfg.Capture.WAL.Slot); err != nil {
		return err
	}
	if cfg.Capture.Mode == "poll" && !rep.Slot.Exists {
		rep.Slot = nil
	}
	if err := rep.readRelays(ctx, tx, l, cfg); err != nil {
		return err
	}
	return rep.readDeadLetters(ctx, tx, l)
}

// readTableFree is read for the table-free outbox (capture.wal.source
// messages): the slot, the relays and the dead letters, as there is no
// outbox table whose backlog could be read.
func (rep *statusReport) readTableFree(ctx context.Context, tx pgx.Tx, l schema.Layout, cfg *config.Config) error {
	if err := rep.readSlot(ctx, tx, cfg.Capture.WAL.Slot); err != nil {
		return err
	}
	if err := rep.readRelays(ctx, tx, l, cfg); err != nil {
		return err
	}
	return rep.readDeadLetters(ctx, tx, l)
}

func (rep *statusReport) readOutbox(ctx context.Context, tx pgx.Tx, l schema.Layout, archiveMode string, info schema.Info) error {
	o := rep.Outbox
	err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s WHERE true %s LIMIT %d) t`,
		l.Outbox.Ident(), l.Unpublished(archiveMode, ""), backlogCap+1)).Scan(&o.Unpublished)
	if err != nil {
		return fmt.Errorf("count the outbox backlog: %w", err)
	}
	if o.Unpublished > backlogCap {
		o.Unpublished, o.Capped = backlogCap, true
	}
	if err := tx.QueryRow(ctx, newBacklogAge(l, archiveMode, info).query).Scan(&o.OldestAgeSeconds); err != nil {
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
		since := s.Since.UTC()
		r := relayStatus{Address: addressOf(s.Application), FoundBy: foundInDatabase, BackendPID: s.PID,
			Client: rowtext.Clean(s.Client, 100), Since: &since}
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

// askRelays asks every relay of the report for its state: those the
// database lists, then the relays at endpoints that are not among them.
// When the database could not be read it asks endpoints (by default the
// relay at http.listen) and then the relays they last saw.
func (rep *statusReport) askRelays(ctx context.Context, cfg *config.Config, endpoints []string) {
	var known []string
	for i, r := range rep.Relays {
		if r.Address != "" {
			rep.Relays[i].Live = &liveReport{URL: "http://" + r.Address}
			known = append(known, r.Address)
		}
	}
	if rep.Database.Error != "" && len(endpoints) == 0 && cfg.HTTP.Listen != "" {
		endpoints = []string{endpointOf(cfg.HTTP.Listen)}
	}
	askAll(ctx, rep.Relays)
	extra := rep.askNew(ctx, endpoints, foundAtEndpoint, &known)
	if rep.Database.Error != "" {
		var peers []string
		for _, r := range extra {
			if r.Live.liveStatus != nil {
				peers = append(peers, r.Live.Peers...)
			}
		}
		slices.Sort(peers)
		var urls []string
		for _, p := range slices.Compact(peers) {
			if addressOf(relayName(p)) == p && !slices.Contains(known, p) {
				urls = append(urls, "http://"+p)
			}
		}
		rep.askNew(ctx, urls, foundAsPeer, &known)
	}
}

// askNew asks the relays at urls and adds to the report, found by foundBy,
// those whose address is not in known, which it extends; it returns them.
func (rep *statusReport) askNew(ctx context.Context, urls []string, foundBy string, known *[]string) []relayStatus {
	asked := make([]relayStatus, len(urls))
	for i, u := range urls {
		asked[i] = relayStatus{FoundBy: foundBy, Live: &liveReport{URL: strings.TrimSuffix(u, "/")}}
	}
	askAll(ctx, asked)
	added := len(rep.Relays)
	for _, r := range asked {
		if r.Live.liveStatus != nil && r.Live.Address != "" {
			r.Address = r.Live.Address
		}
		if r.Address != "" && slices.Contains(*known, r.Address) {
			continue
		}
		if r.Address != "" {
			*known = append(*known, r.Address)
		}
		rep.Relays = append(rep.Relays, r)
	}
	return rep.Relays[added:]
}

// askAll asks every relay of rs with a Live URL for its state, at once,
// each within liveTimeout.
func askAll(ctx context.Context, rs []relayStatus) {
	var wg sync.WaitGroup
	for i := range rs {
		if rs[i].Live == nil {
			continue
		}
		wg.Add(1)
		go func(l *liveReport) {
			defer wg.Done()
			l.ask(ctx)
		}(rs[i].Live)
	}
	wg.Wait()
}

// ask reads GET /status from the relay at l.URL into l, every string made
// printable.
func (l *liveReport) ask(ctx context.Context) {
	st, err := fetchLive(ctx, l.URL)
	l.URL = rowtext.Clean(redact.String(l.URL), 200)
	if err != nil {
		l.Error = rowtext.Clean(redact.String(err.Error()), 300)
		return
	}
	st.Address = addressOf(relayName(st.Address))
	st.Hostname, st.Version = rowtext.Clean(st.Hostname, 100), rowtext.Clean(st.Version, 100)
	st.Starting = rowtext.Clean(st.Starting, 300)
	st.DatabaseError = rowtext.Clean(st.DatabaseError, 300)
	for i, d := range st.Broken {
		st.Broken[i] = liveDestination{Name: rowtext.Clean(d.Name, 200), Since: d.Since.UTC(), Error: rowtext.Clean(d.Error, 300)}
	}
	l.liveStatus = &st
}

// judge sets Healthy, Problems and Warnings.
func (rep *statusReport) judge(cfg *config.Config, maxAge time.Duration) {
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }
	warn := func(format string, args ...any) { rep.Warnings = append(rep.Warnings, fmt.Sprintf(format, args...)) }
	switch d := rep.Database; {
	case !d.Reachable:
		problem("the database is unreachable: %s", d.Error)
	case d.Error != "":
		problem("the database cannot be read: %s", d.Error)
	}
	if d := rep.Database; d.Error != "" && len(rep.Relays) == 0 {
		warn("no relay to ask: give relay status --endpoint URL of any relay (it names the others it last saw)")
	}
	if d := rep.Database; d.Error == "" && len(rep.Problems) == 0 { // no problem yet: the outbox table exists
		rep.judgeDatabase(cfg, maxAge, problem, warn)
	}
	for _, r := range rep.Relays {
		rep.judgeRelay(r, problem, warn)
	}
	rep.Healthy = len(rep.Problems) == 0
}

// judgeDatabase adds the problems and warnings of what the database says.
func (rep *statusReport) judgeDatabase(cfg *config.Config, maxAge time.Duration, problem, warn func(string, ...any)) {
	if age := time.Duration(rep.Outbox.OldestAgeSeconds * float64(time.Second)); age > maxAge {
		problem("the oldest unpublished event is %s old (more than %s)", age.Round(time.Second), maxAge)
	}
	if countFound(rep.Relays, foundInDatabase) == 0 {
		problem("no relay runs on outbox %s", rep.Outbox.Table)
	}
	if s := rep.Slot; s != nil && rep.Mode == "poll" {
		if s.Active {
			warn("replication slot %s is in use although the relays poll: something else streams from it", s.Name)
		} else {
			problem("replication slot %s is left from an earlier wal run: nothing reads it and it keeps %s of WAL from being removed; "+
				"if no relay will run in wal mode again, drop it: SELECT pg_drop_replication_slot('%s')", s.Name, bytesText(s.RetainedBytes), s.Name)
		}
	}
	if s := rep.Slot; s != nil && rep.Mode == "wal" {
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
}

// judgeRelay adds the problems and warnings of what relay r says.
func (rep *statusReport) judgeRelay(r relayStatus, problem, warn func(string, ...any)) {
	l := r.Live
	switch {
	case l == nil:
		warn("the relay %s (client %s) advertises no HTTP address (no http.listen, or an older release): its destinations are not checked",
			r.name(), r.Client)
	case l.Error != "":
		problem("the relay at %s does not answer: %s", l.URL, l.Error)
	case r.FoundBy == foundInDatabase && l.Address != r.Address:
		problem("the relay that advertises %s is not the one answering there (it says %q): set http.advertise to an address other hosts reach it at",
			r.Address, l.Address)
	case l.Starting != "":
		problem("the relay at %s has not started: %s", r.name(), l.Starting)
	case l.DatabaseError != "":
		problem("the database refuses the relay at %s: %s", r.name(), l.DatabaseError)
	case !l.Capturing:
		problem("the relay at %s cannot capture (is Postgres reachable?)", r.name())
	case len(l.Broken) > 0:
		problem("the relay at %s holds the events of %d broken destination(s)", r.name(), len(l.Broken))
	}
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
	switch d := rep.Database; {
	case !d.Reachable:
		fmt.Fprintf(w, "database      UNREACHABLE: %s\n", d.Error)
	case d.Error != "":
		fmt.Fprintf(w, "database      cannot be read: %s\n", d.Error)
	default:
		fmt.Fprintf(w, "database      reachable\n")
	}
	if o := rep.Outbox; o != nil && rep.Database.Error == "" {
		fmt.Fprintf(w, "outbox        %s: %s\n", o.Table, backlogText(o))
	}
	if s := rep.Slot; s != nil {
		rep.printSlot(w, s)
	}
	switch {
	case rep.Database.Error == "":
		fmt.Fprintf(w, "relays        %d on the outbox\n", countFound(rep.Relays, foundInDatabase))
	default:
		fmt.Fprintf(w, "relays        %d asked: the one at the endpoint and those it last saw (the database, which lists them all, cannot be read)\n", len(rep.Relays))
	}
	for _, r := range rep.Relays {
		r.print(w, rep.Partitions != nil)
	}
	if p := rep.Partitions; p != nil {
		switch {
		case len(p.Unowned) == 0:
			fmt.Fprintf(w, "partitions    %d, each owned by a relay\n", p.Total)
		default:
			fmt.Fprintf(w, "partitions    %d, %d without an owner: %s\n", p.Total, len(p.Unowned), ranges(p.Unowned))
		}
	}
	if rep.Database.Error == "" {
		fmt.Fprintf(w, "dead letters  %d\n", sumDeadLetters(rep.DeadLetters))
	}
	for _, d := range rep.DeadLetters {
		fmt.Fprintf(w, "  %-14s %d, last %s\n", d.ErrorClass, d.Count, d.LastFailedAt.Format(time.RFC3339))
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM  %s\n", p)
	}
	for _, x := range rep.Warnings {
		fmt.Fprintf(w, "WARN     %s\n", x)
	}
}

// backlogText describes the outbox backlog in words.
func backlogText(o *outboxStatus) string {
	if o.Unpublished == 0 {
		return "nothing unpublished"
	}
	more := ""
	if o.Capped {
		more = "more than "
	}
	return fmt.Sprintf("%s%d unpublished, the oldest waiting for %s", more, o.Unpublished,
		time.Duration(o.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond))
}

// printSlot writes the replication slot's line.
func (rep *statusReport) printSlot(w io.Writer, s *slotStatus) {
	if !s.Exists {
		fmt.Fprintf(w, "slot          %s: missing\n", s.Name)
		return
	}
	limit := "unlimited max_slot_wal_keep_size"
	if s.MaxSlotWALKeepSize > 0 {
		limit = fmt.Sprintf("%s left of max_slot_wal_keep_size %s", bytesText(max(s.SafeWALSizeBytes, 0)), bytesText(s.MaxSlotWALKeepSize))
	}
	state := map[bool]string{true: "active", false: "inactive"}[s.Active]
	if rep.Mode == "poll" {
		state += ", left from an earlier wal run"
	}
	fmt.Fprintf(w, "slot          %s: %s, wal_status %s, retained WAL %s (%s), confirmed %s behind\n", s.Name,
		state, s.WALStatus, bytesText(s.RetainedBytes), limit, bytesText(s.ConfirmedLagBytes))
}

func countFound(rs []relayStatus, foundBy string) int {
	n := 0
	for _, r := range rs {
		if r.FoundBy == foundBy {
			n++
		}
	}
	return n
}

// print writes r's lines: what the database says, then what it says.
func (r relayStatus) print(w io.Writer, partitioned bool) {
	addr := r.Address
	switch {
	case addr == "" && r.Live != nil:
		addr = r.Live.URL
	case addr == "":
		addr = "(no HTTP address)"
	}
	fmt.Fprintf(w, "  %-22s", addr)
	switch {
	case r.FoundBy != foundInDatabase:
		fmt.Fprintf(w, " found as %s", map[string]string{foundAsPeer: "a peer another relay named", foundAtEndpoint: "an endpoint"}[r.FoundBy])
	default:
		fmt.Fprintf(w, " %s", r.Role)
		if partitioned {
			fmt.Fprintf(w, " partitions %s", ranges(r.Partitions))
		}
		fmt.Fprintf(w, ", connected since %s (postgres backend pid %d", r.Since.Format(time.RFC3339), r.BackendPID)
		if r.Client != "" {
			fmt.Fprintf(w, ", client %s", r.Client)
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
	l := r.Live
	switch {
	case l == nil:
		fmt.Fprintln(w, "      says: nothing (it advertises no address to ask)")
	case l.Error != "":
		fmt.Fprintf(w, "      says: nothing, %s does not answer: %s\n", l.URL, l.Error)
	default:
		fmt.Fprintf(w, "      says: host %s, pid %d, version %s; %s\n", l.Hostname, l.PID, l.Version, l.summary())
		for _, d := range l.Broken {
			fmt.Fprintf(w, "      destination %s broken since %s: %s\n", d.Name, d.Since.Format(time.RFC3339), d.Error)
		}
	}
}

// summary says in words what a relay that answered says about itself.
func (l *liveReport) summary() string {
	switch {
	case l.Starting != "":
		return l.Starting
	case l.DatabaseError != "":
		return "the database refuses it: " + l.DatabaseError
	case !l.Capturing:
		return "NOT capturing (is Postgres reachable?)"
	}
	var b strings.Builder
	b.WriteString("capturing")
	if l.Leading != nil {
		b.WriteString(map[bool]string{true: " (streams)", false: " (stands by)"}[*l.Leading])
	}
	switch {
	case len(l.Broken) > 0:
		fmt.Fprintf(&b, ", %d destination(s) BROKEN", len(l.Broken))
	case !l.Ready:
		b.WriteString(", a publish waits for the broker")
	default:
		b.WriteString(", every destination works")
	}
	fmt.Fprintf(&b, "; since it started %d published, %d dead-lettered, %d retries", l.Published, l.DeadLettered, l.Retries)
	return b.String()
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

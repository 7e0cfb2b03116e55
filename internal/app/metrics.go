package app

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/outboxrelay/relay/capture/wal"
	"github.com/outboxrelay/relay/internal/buildinfo"
	"github.com/outboxrelay/relay/internal/rowtext"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/pipeline"
	"github.com/outboxrelay/relay/sink"
)

// partitioned is implemented by sources that share work in partitions.
type partitioned interface {
	// Partitions returns how many partitions this relay holds, of all.
	Partitions() (held, total int)
}

// leader is implemented by sources where one relay captures and the others
// stand by.
type leader interface{ Leading() bool }

// slotWatcher is implemented by sources that stream from a replication
// slot.
type slotWatcher interface {
	Slot() wal.SlotState
	SlotRecreated(reason string) int64
	StallRecoveries(action string) int64
}

// replayer is implemented by sources that replay events an earlier run
// may have handed to the broker (wal.Source.Replayed).
type replayer interface {
	Replayed() (skipped int64)
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// newRegistry returns a registry with the Go and process collectors and
// relay_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bi := buildinfo.Read()
	info := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "relay", Name: "build_info",
		Help:        "1, labelled with the relay's version, VCS commit and Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "go_version": bi.GoVersion}})
	info.Set(1)
	reg.MustRegister(info)
	return reg
}

// registerStats exposes the pipeline's counters, the source's state, the
// outbox backlog age and sink.held_max_age (heldMaxAge) on reg. capturing
// reports whether capture works: the pipeline's view and a lasting
// database failure the source's guard holds.
func registerStats(reg prometheus.Registerer, st *pipeline.Stats, src any, backlog *sampled, capturing func() bool, heldMaxAge time.Duration) {
	counter := func(name, help string, f func() int64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: name, Help: help},
			func() float64 { return float64(f()) }))
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: name, Help: help}, f))
	}
	counter("events_captured_total", "Events read from the outbox.", st.Captured.Load)
	counter("events_published_total", "Events acknowledged by the sink.", st.Published.Load)
	counter("events_dead_lettered_total", "Events moved to the dead-letter table.", st.DeadLettered.Load)
	counter("publish_retries_total", "Failed publish attempts that were retried.", st.Retries.Load)
	counter("events_archived_total", "Events archived after publishing.", st.Archived.Load)
	gauge("events_in_flight", "Events captured and not yet settled.", func() float64 { return float64(st.InFlight.Load()) })
	gauge("sink_ready", "1 when the broker and fixed destinations work, not every destination rows chose is broken, and no publish has waited over 5s for the broker.",
		func() float64 { return boolFloat(st.SinkReady()) })
	gauge("destinations_broken", "Destinations the relay holds events for because they fail (auth, ACL, missing topic/queue/stream/route, unreachable).",
		func() float64 { return float64(st.Broken.Load()) })
	gauge("held_aggregates", "Aggregates whose events are left in the outbox table while their destination is broken; they are published, in order, when it works again.",
		func() float64 { return float64(st.HeldAggregates.Load()) })
	gauge("held_max_age_seconds", "sink.held_max_age: how long a destination may stay broken before its held events are dead-lettered; 0: never.",
		func() float64 { return heldMaxAge.Seconds() })
	gauge("capture_ready", "1 while capture works: Postgres answers and accepts the relay's statements.",
		func() float64 { return boolFloat(capturing()) })
	gauge("oldest_unpublished_age_seconds", "Age of the oldest row still in the outbox (by seq), 0 when empty.", backlog.load)
	if w, ok := src.(slotWatcher); ok {
		registerSlot(reg, w)
	}
	if r, ok := src.(replayer); ok {
		counter("events_replay_skipped_total", "Events replayed from the slot after a restart or reconnect and not published again because an earlier run had archived them.",
			r.Replayed)
	}
	if l, ok := src.(leader); ok {
		gauge("capture_leader", "1 while this relay streams, 0 while it stands by.", func() float64 { return boolFloat(l.Leading()) })
	}
	if p, ok := src.(partitioned); ok {
		gauge("partitions_held", "Poll partitions this relay leases.", func() float64 { h, _ := p.Partitions(); return float64(h) })
		gauge("partitions_total", "Poll partitions of the outbox.", func() float64 { _, t := p.Partitions(); return float64(t) })
	}
}

// registerTruncations exposes relay_outbox_truncations_total and
// relay_outbox_truncate_lock_timeouts_total of archive mode partition, when
// src truncates (wal capture).
func registerTruncations(reg prometheus.Registerer, src any) {
	t, ok := src.(interface {
		Truncations() int64
		TruncateLockTimeouts() int64
	})
	if !ok {
		return
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "outbox_truncations_total",
		Help: "Partitions of the outbox ring (archive.mode partition) truncated once every row in them was published or dead-lettered."},
		func() float64 { return float64(t.Truncations()) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "outbox_truncate_lock_timeouts_total",
		Help: "Truncations of an outbox partition put off to the next second because its lock was not granted within 100ms."},
		func() float64 { return float64(t.TruncateLockTimeouts()) }))
}

// registerHeaderDrops exposes relay_row_headers_dropped_total, one series
// per reason, labelled with the sink type.
func registerHeaderDrops(reg prometheus.Registerer, drops *sink.HeaderDrops, sinkType string) {
	for _, reason := range sink.DropReasons {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "row_headers_dropped_total",
			Help:        "Row headers not forwarded, by reason: reserved (named like a header the relay sets, in any case), control (one the broker or HTTP would act on).",
			ConstLabels: prometheus.Labels{"sink": sinkType, "reason": reason}},
			func() float64 { return float64(drops.Count(reason)) }))
	}
}

// registerRunBreaks exposes relay_kafka_run_breaks_total, the runs of one
// aggregate the Kafka broker did not store as one batch, when breaks is
// not nil (the Kafka sink).
func registerRunBreaks(reg prometheus.Registerer, breaks func() int64) {
	if breaks == nil {
		return
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "kafka_run_breaks_total",
		Help: "Publishes in which Kafka did not store one aggregate's records as one batch: its order on the topic may be broken; should stay 0."},
		func() float64 { return float64(breaks()) }))
}

// registerSlot exposes the replication slot's state, as the source last
// observed it, on reg.
func registerSlot(reg prometheus.Registerer, w slotWatcher) {
	gauge := func(name, help string, f func(wal.SlotState) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: name, Help: help},
			func() float64 { return f(w.Slot()) }))
	}
	gauge("replication_slot_lag_bytes", "WAL between the slot's confirmed_flush_lsn and the server's current position (-1 when missing).",
		func(s wal.SlotState) float64 { return float64(s.LagBytes) })
	gauge("replication_slot_retained_wal_bytes", "WAL the server keeps for the slot: from its restart_lsn to the current position (-1 when missing).",
		func(s wal.SlotState) float64 { return float64(s.RetainedBytes) })
	gauge("replication_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is lost (pg_replication_slots.safe_wal_size; -1 when max_slot_wal_keep_size is unlimited).",
		func(s wal.SlotState) float64 { return float64(s.SafeWALSize) })
	gauge("replication_slot_wal_keep_size_bytes", "The server's max_slot_wal_keep_size (-1 when unlimited).",
		func(s wal.SlotState) float64 { return float64(s.KeepSize) })
	gauge("replication_slot_safe_wal_fraction", "safe_wal_size as a fraction of max_slot_wal_keep_size: 1 with all the room left, 0 when the slot is about to be lost; NaN when unlimited or unknown.",
		safeFraction)
	gauge("replication_slot_active", "1 while a walsender streams from the slot (this relay or another), 0 while none does or the slot is missing.",
		func(s wal.SlotState) float64 { return boolFloat(s.Active) })
	gauge("replication_slot_failover", "1 when the slot is synchronized to standbys (PostgreSQL 17 failover slots).",
		func(s wal.SlotState) float64 { return boolFloat(s.Failover) })
	gauge("replication_slot_stalled_seconds", "How long the slot's confirmed_flush_lsn has not moved while the outbox held unpublished rows; 0 when it moved or the outbox is empty.",
		func(s wal.SlotState) float64 { return s.StalledFor.Seconds() })
	for _, status := range walStatuses {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: "replication_slot_wal_status",
			Help: "1 for the slot's current wal_status.", ConstLabels: prometheus.Labels{"status": status}},
			func() float64 { return boolFloat(w.Slot().WALStatus == status) }))
	}
	for _, reason := range wal.SlotRecreateReasons {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "replication_slot_recreated_total",
			Help:        "Replication slots recreated (the rows committed before the new slot are published from the table), by reason: failover (missing on a promoted standby), dropped, lost.",
			ConstLabels: prometheus.Labels{"reason": reason}},
			func() float64 { return float64(w.SlotRecreated(reason)) }))
	}
	for _, action := range wal.StallActions {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "relay", Name: "replication_slot_stall_recoveries_total",
			Help:        "Recovery steps taken because the slot stalled, by action: reconnect (the stream), drain (the outbox published from the table).",
			ConstLabels: prometheus.Labels{"action": action}},
			func() float64 { return float64(w.StallRecoveries(action)) }))
	}
}

// safeFraction returns safe_wal_size / max_slot_wal_keep_size, or NaN when
// either is unknown or unlimited.
func safeFraction(s wal.SlotState) float64 {
	if !s.Exists || s.KeepSize <= 0 || s.WALStatus == "lost" {
		return math.NaN()
	}
	return float64(max(s.SafeWALSize, 0)) / float64(s.KeepSize)
}

// destinationCollector exposes the broken destinations, at most
// pipeline.MaxLabelValues of them (the longest broken), one series each: a
// working destination has none, which bounds the label values. A name is
// escaped and cut with rowtext.Label; two names that become one label are
// one series.
type destinationCollector struct {
	list          func() []pipeline.DestinationStatus
	ready, broken *prometheus.Desc
}

func newDestinationCollector(list func() []pipeline.DestinationStatus) *destinationCollector {
	return &destinationCollector{
		list: list,
		ready: prometheus.NewDesc("relay_destination_ready",
			"0 for a destination whose breaker is open (at most 32 series, names escaped and cut to 64 bytes; a working destination has none).", []string{"destination"}, nil),
		broken: prometheus.NewDesc("relay_destination_broken_seconds",
			"How long a broken destination has failed (at most 32 series, names escaped and cut to 64 bytes; a working destination has none).", []string{"destination"}, nil),
	}
}

func (c *destinationCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ready
	ch <- c.broken
}

func (c *destinationCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	seen := map[string]bool{}
	for _, d := range c.list() {
		name := rowtext.Label(d.Name)
		if seen[name] {
			continue
		}
		seen[name] = true
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, 0, name)
		ch <- prometheus.MustNewConstMetric(c.broken, prometheus.GaugeValue, now.Sub(d.Since).Seconds(), name)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// sampled is a value sampled with one query that returns a float8: the age
// of the oldest outbox row (newBacklogAge), the rows of the dead-letter
// table (newDeadLetterCount). Safe for concurrent use.
type sampled struct {
	bits  atomic.Uint64 // float64
	query string
}

// newBacklogAge returns the sample of the age of the oldest unpublished
// row of an outbox with the columns info describes. Without seq the oldest
// is the row of the oldest inserting transaction; without created_at its
// age is its transaction's commit time's when track_commit_timestamp is on,
// else 0.
func newBacklogAge(l schema.Layout, archiveMode string, info schema.Info) *sampled {
	at, order := schema.Q(l.Cols.CreatedAt), schema.Q(l.Cols.Seq)
	if info.Lacks(l.Cols.CreatedAt) {
		at = `CASE WHEN current_setting('track_commit_timestamp')::bool THEN pg_xact_commit_timestamp(xmin) END`
	}
	if info.Lacks(l.Cols.Seq) {
		order = "age(xmin) DESC"
	}
	return &sampled{query: fmt.Sprintf(`SELECT coalesce(extract(epoch FROM now() - (
		SELECT %s FROM %s WHERE true %s ORDER BY %s LIMIT 1)), 0)::float8`,
		at, l.Outbox.Ident(), l.Unpublished(archiveMode, ""), order)}
}

// deadLetterCap is the most dead-letter rows newDeadLetterCount counts.
const deadLetterCap = 100_000

func newDeadLetterCount(l schema.Layout) *sampled {
	return &sampled{query: fmt.Sprintf(`SELECT count(*)::float8 FROM (SELECT 1 FROM %s LIMIT %d) t`, l.DeadLetter.Ident(), deadLetterCap)}
}

// registerTables exposes the capture mode and the dead-letter table's rows
// on reg.
func registerTables(reg prometheus.Registerer, mode string, deadLetters *sampled) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: "capture_mode",
		Help: "1, labelled with capture.mode (wal or poll).", ConstLabels: prometheus.Labels{"mode": mode}},
		func() float64 { return 1 }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "relay", Name: "dead_letters",
		Help: "Rows in the dead-letter table, sampled every few seconds, counted up to 100000: dead-lettering raises it, relay dlq redrive and drop lower it."},
		deadLetters.load))
}

func (b *sampled) load() float64 { return math.Float64frombits(b.bits.Load()) }

// watch samples every interval until ctx ends. A failed sample keeps the
// last value; capture errors are reported elsewhere.
func (b *sampled) watch(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var v float64
		if err := pool.QueryRow(ctx, b.query).Scan(&v); err == nil {
			b.bits.Store(math.Float64bits(v))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

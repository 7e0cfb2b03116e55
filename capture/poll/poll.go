// Package poll captures outbox rows by polling the outbox table: each batch
// is claimed with SELECT … FOR UPDATE SKIP LOCKED in seq order in a short
// transaction that commits before the batch is published, and its published
// rows are archived and its failed ones dead-lettered in another short
// transaction once the pipeline settled it. No transaction stays open while
// events are published; docs/design.md explains why order and exclusivity
// still hold, and "Late commits" in capture/internal/claim/source.go why a
// row committed late is never overtaken.
//
// The claiming and archiving live in capture/internal/claim, which wal
// capture also uses to drain the rows older than its slot; this package
// adds what is poll mode's own: the capture configuration lock every poll
// relay on one outbox shares (see schema.JoinMode).
package poll

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/capture"
	"github.com/outboxrelay/relay/capture/internal/claim"
	"github.com/outboxrelay/relay/capture/table"
	"github.com/outboxrelay/relay/internal/schema"
	"github.com/outboxrelay/relay/internal/wait"
)

// Options configures a Source. Zero values take the defaults given.
type Options struct {
	// Pool serves the claiming and archiving transactions, each holding a
	// connection for a few round trips only, so any size works. The lease
	// connection (partition leases, LISTEN and the capture configuration
	// lock) is opened separately with the pool's config: see
	// DedicatedConns.
	Pool *pgxpool.Pool
	// Layout names the outbox and dead-letter tables (and the archive
	// table of archive mode move).
	Layout table.Layout
	// BatchSize is the most rows one claim takes. Default 500.
	BatchSize int
	// MaxBatchBytes ends a claim once its rows hold this many bytes
	// (event.Event.Size): the server sends the rows up to it, counted
	// without reading their values, and the claim keeps them while their
	// real size stays under it; at least one row, so a row larger than it
	// is claimed alone. The rest stay in the outbox for the next claim.
	// Rows claimed and not settled hold at most three times as much.
	// Default 8 MiB.
	MaxBatchBytes int
	// Interval is the longest wait between polls while the outbox is idle;
	// while rows keep coming the poller looks again within milliseconds. An
	// insert wakes it at once when the notify trigger of `relay init`
	// (capture.poll.notify) is installed. Default 200ms.
	Interval time.Duration
	// Linger is how long the poller waits after a claim that found rows,
	// fewer than 32, so that a steady stream of small transactions is
	// claimed in fewer, larger batches: each row waits at most Linger more,
	// and the relay claims, publishes and archives once per Linger rather
	// than once per few rows. Notifications do not end it. Default 5ms.
	Linger time.Duration
	// Partitions is how many partitions the outbox is split into by a hash
	// of the ordering key (table.Columns.Key), the unit of work shared
	// between relays (see Scale-out in capture/internal/claim/lease.go).
	// Every relay on one outbox must use the same number.
	// Default 16.
	Partitions int
	// ArchiveMode is what happens to published rows: schema.ArchiveDelete,
	// ArchiveMark or ArchiveMove. Default delete.
	ArchiveMode string
	// ParkAggregates skips aggregates that have a row in the dead-letter
	// table (dead_letter.park_aggregate). Default false.
	ParkAggregates bool
	// Exclusive makes one relay at a time capture from the outbox: the
	// relay whose lease connection holds an exclusive advisory lock of the
	// outbox table (see exclusive); the others wait without joining the
	// relays, so the holder leases every partition. A transactional Kafka
	// sink needs it, since its transactional id admits one producer.
	// Default false: every relay captures its share of the partitions.
	Exclusive bool
	// Logger receives the source's logs. Default slog.Default().
	Logger *slog.Logger
}

// DedicatedConns is how many connections a Source opens besides its pool:
// the lease connection.
const DedicatedConns = claim.DedicatedConns

// Source is a poll-mode capture.Source. Next must be called from one
// goroutine; batches may be completed from others.
type Source struct{ src *claim.Source }

// New inspects the outbox table, creates the dead-letter table when it is
// missing and returns a source. A missing outbox table is a permanent error.
func New(ctx context.Context, opts Options) (*Source, error) {
	l := schema.Layout(opts.Layout)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	src, err := claim.New(ctx, claim.Options{Pool: opts.Pool, Layout: l, BatchSize: opts.BatchSize,
		MaxBatchBytes: opts.MaxBatchBytes, Interval: opts.Interval, Linger: opts.Linger, Partitions: opts.Partitions,
		ArchiveMode: opts.ArchiveMode, ParkAggregates: opts.ParkAggregates, Logger: opts.Logger,
		Join: func(ctx context.Context, conn *pgx.Conn, partitions int) error {
			if err := schema.JoinMode(ctx, conn, l, partitions); err != nil {
				return err
			}
			if opts.Exclusive {
				return exclusive(ctx, conn, l.Outbox.String(), opts.Logger)
			}
			return nil
		}})
	if err != nil {
		return nil, err
	}
	return &Source{src: src}, nil
}

// Next claims the next batch of the partitions this relay leases, waiting
// while the outbox is idle or this relay holds no partition. A capture
// configuration lock that another relay's settings conflict with is
// returned as *schema.ModeConflict.
func (s *Source) Next(ctx context.Context) (capture.Batch, error) { return s.src.Next(ctx) }

// Capturing reports whether the source can capture (capture.Health): its
// lease connection is up and the last claim on it worked, whether or not
// it found rows. It is safe for concurrent use.
func (s *Source) Capturing() bool { return s.src.Capturing() }

// Close releases the lease connection, which gives up every partition and
// the capture configuration lock.
func (s *Source) Close() error { return s.src.Close() }

// Partitions returns how many partitions this relay leases and claims, of
// all. It is safe for concurrent use.
func (s *Source) Partitions() (held, total int) { return s.src.Partitions() }

// standbyInterval is how often a relay waiting for the exclusive lock
// tries to take it.
const standbyInterval = time.Second

// exclusive waits until conn, the lease connection, holds the exclusive
// capture lock of table (Options.Exclusive), trying every standbyInterval.
// The lock is a session lock: it goes with the lease connection, and with
// it every partition lease, so a relay never claims without it. It has the
// one-key form, which the two-key locks of leases and capture modes never
// meet (and relay status does not list as a partition).
func exclusive(ctx context.Context, conn *pgx.Conn, table string, log *slog.Logger) error {
	h := fnv.New64a()
	h.Write([]byte("outbox-relay:exclusive:" + table))
	key := int64(h.Sum64() & 0x7fffffffffffffff)
	standby := false
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::bigint)`, key).Scan(&got); err != nil {
			return fmt.Errorf("take the exclusive capture lock: %w", err)
		}
		if got {
			if standby {
				log.Info("exclusive poll capture taken over", "table", table)
			}
			return nil
		}
		if !standby {
			log.Info("another relay captures from this outbox alone (sink.kafka.transactional); standing by", "table", table)
			standby = true
		}
		if err := wait.Sleep(ctx, standbyInterval); err != nil {
			return err
		}
	}
}

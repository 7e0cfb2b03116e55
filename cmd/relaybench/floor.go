package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/wait"
)

// The floors of the impact phase: what any relay of a capture mode must
// cost the database at least, measured like a relay run.
const (
	// floorPoll is the poll floor: a minimal poller deleting batches with
	// rawDelete, publishing nothing.
	floorPoll = "floor_poll"
	// floorPollPublish is floorPoll publishing each batch to the run's
	// sink, every acknowledgement awaited before the next batch.
	floorPollPublish = "floor_poll_publish"
	// floorWAL is the wal floor: pg_recvlogical decoding the outbox's
	// inserts into /dev/null; the rows stay in the outbox.
	floorWAL = "floor_wal"
	// floorWALDelete is floorWAL plus an archive loop deleting the decoded
	// rows every archiveEvery.
	floorWALDelete = "floor_wal_delete"
)

// floorsOf lists the floor runs of each capture mode; the first is the one
// the mode's relay is compared with.
var floorsOf = map[string][]string{"poll": {floorPoll, floorPollPublish}, "wal": {floorWAL, floorWALDelete}}

// floorOf returns the run that run's ratios to the floor are taken against:
// its mode's first floor for a relay (floorWAL for the messages and
// partition relays, the mode's for a previous release's), floorWAL for
// floorWALDelete (the archive's share), floorPoll for floorPollPublish (the
// publishing's share), empty otherwise.
func floorOf(run string) string {
	run, _ = runBase(run)
	switch run {
	case "messages", "partition":
		return floorWAL
	case floorWALDelete:
		return floorWAL
	case floorPollPublish:
		return floorPoll
	}
	if f := floorsOf[run]; len(f) > 0 {
		return f[0]
	}
	return ""
}

func isFloor(run string) bool {
	return run == floorPoll || run == floorPollPublish || run == floorWAL || run == floorWALDelete
}

// floorWhat describes what each floor runs.
var floorWhat = map[string]string{
	floorPoll: "one connection: " + rawDelete("seq", floorBatch) + ", reading every returned row; " +
		"again at once after a full batch, after 5 ms after a short one, doubling up to 200 ms while batches come back empty; publishes nothing",
	floorPollPublish: "the poll floor, publishing the id and payload of each batch's rows to the run's sink before the next batch " +
		"(NATS: nats.go's PublishMsgAsync with the id as Nats-Msg-Id, then every acknowledgement; Kafka: franz-go's ProduceSync, 5 ms linger)",
	floorWAL: "pg_recvlogical --start -f /dev/null -F 0 -s 1 -o proto_version=1 -o publication_names=" + benchPublication +
		" on the relay's slot and publication; archives nothing: the rows stay in the outbox",
	floorWALDelete: "the wal floor, plus one connection running every 20 ms " + archiveFloorSQL +
		" with $1 the highest seq of the tick before: the rows committed at least 20 ms earlier",
}

// Pacing of the floor loops: the poll relay's batch size, its wait after a
// short claim and its default poll interval; the wal relay's archive period.
const (
	floorBatch   = 500
	floorWait    = 5 * time.Millisecond
	floorIdle    = 200 * time.Millisecond
	archiveEvery = 20 * time.Millisecond
)

// archiveFloorSQL is the wal floor's archive: it deletes the rows up to $1
// and returns the highest seq present, the next tick's bound.
const archiveFloorSQL = `WITH gone AS (DELETE FROM outbox WHERE seq <= $1) SELECT max(seq) FROM outbox`

// rawDelete is what a minimal poller runs per batch: it deletes the limit
// oldest unlocked rows, chosen by key, and returns them.
func rawDelete(key string, limit int) string {
	return fmt.Sprintf(`DELETE FROM outbox WHERE %[1]s IN (SELECT %[1]s FROM outbox ORDER BY seq LIMIT %[2]d FOR UPDATE SKIP LOCKED) RETURNING *`, key, limit)
}

// queryer runs queries: a *pgx.Conn or a *pgxpool.Conn.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// deleteBatch runs query, a rawDelete, and reads every returned row. It
// returns how many rows and bytes came back.
func deleteBatch(ctx context.Context, q queryer, query string) (n, bytes int, err error) {
	rows, err := q.Query(ctx, query)
	if err != nil {
		return 0, 0, err
	}
	for rows.Next() {
		for _, v := range rows.RawValues() {
			bytes += len(v)
		}
		n++
	}
	rows.Close()
	return n, bytes, rows.Err()
}

// recvlogicalArgs are pg_recvlogical's arguments to stream slot of the
// database at dsn through publication pub into /dev/null, with no fsync
// and a standby status update every status seconds.
func recvlogicalArgs(dsn, slot, pub string, status int) []string {
	return []string{"-d", dsn, "--slot", slot, "--start", "-f", "/dev/null", "-F", "0", "-s", strconv.Itoa(status),
		"-o", "proto_version=1", "-o", "publication_names=" + pub}
}

// startFloor starts the processes of floor run on d: for the wal floors
// pg_recvlogical on the relay's slot and publication, with the relay's
// status interval (1 s), then, once it has caught up with the WAL written
// so far, this binary re-executed as the floor's database loop (-as-floor).
func (b *bench) startFloor(ctx context.Context, d *database, run string) ([]*relayProc, error) {
	var procs []*relayProc
	if run == floorWAL || run == floorWALDelete {
		p, err := b.startProc(run+"-recvlogical", 0, filepath.Join(b.pgBin, "pg_recvlogical"),
			recvlogicalArgs(d.dsn, d.slot(), benchPublication, 1)...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		if err := decoderCatchUp(ctx, d, procs); err != nil {
			return procs, err
		}
	}
	kind := map[string]string{floorPoll: "poll", floorPollPublish: "publish", floorWALDelete: "archive"}[run]
	if kind == "" {
		return procs, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return procs, err
	}
	args := []string{"-as-floor", kind, d.dsn}
	if run == floorPollPublish {
		if err := b.prepareFloorSink(ctx, d); err != nil {
			return procs, err
		}
		args = append(args, floorSinkArgs(d)...)
	}
	p, err := b.startProc(run+"-"+kind, 0, exe, args...)
	if err != nil {
		return procs, err
	}
	return append(procs, p), nil
}

// waitFloor waits up to two minutes after the load until floor run has
// handled every committed event: the outbox is empty (the floors that
// delete) and the slot's walsender has sent the WAL written until then
// (the wal floors).
func (b *bench) waitFloor(ctx context.Context, d *database, run string, procs []*relayProc, res *ImpactResult) error {
	t0 := time.Now()
	if run != floorWAL {
		err := waitFor(ctx, 2*time.Minute, procs, func() (bool, error) {
			var empty bool
			err := d.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM outbox)").Scan(&empty)
			return empty, err
		})
		if err != nil {
			return fmt.Errorf("outbox not emptied: %w", err)
		}
	}
	if run == floorWAL || run == floorWALDelete {
		if err := decoderCatchUp(ctx, d, procs); err != nil {
			return err
		}
	}
	res.EventsRelayed, res.Complete, res.CatchUpSeconds = res.Transactions, true, time.Since(t0).Seconds()
	return nil
}

// decoderCatchUp waits up to two minutes until the walsender streaming d's
// slot has sent the WAL written when it was called.
func decoderCatchUp(ctx context.Context, d *database, procs []*relayProc) error {
	target, err := walLSN(ctx, d)
	if err != nil {
		return err
	}
	err = waitFor(ctx, 2*time.Minute, procs, func() (bool, error) {
		var sent bool
		err := d.pool.QueryRow(ctx, `SELECT coalesce(bool_or(r.sent_lsn - '0/0'::pg_lsn >= $2), false)
			FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`,
			d.slot(), target).Scan(&sent)
		return sent, err
	})
	if err != nil {
		return fmt.Errorf("slot %s not streamed up to the current WAL: %w", d.slot(), err)
	}
	return nil
}

// waitFor calls done every 20 ms until it reports true, and fails when
// done fails, a process of procs exits, ctx ends or limit passes.
func waitFor(ctx context.Context, limit time.Duration, procs []*relayProc, done func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := done()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("not done after %s", limit)
		}
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return err
			}
		}
		if err := wait.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// asFloor runs a floor's database loop until SIGTERM or SIGINT. args are
// the kind and the database's DSN, and for kind "publish" the sink (nats
// or kafka) and its address: "poll" is pollFloor publishing nothing,
// "publish" pollFloor publishing to the sink, "archive" archiveFloor. It
// runs with the relay's GODEBUG (see startProc).
func asFloor(args []string, stderr io.Writer) int {
	kind, dsn := args[0], args[1]
	var loop func(context.Context, *pgx.Conn) error
	switch {
	case kind == "poll" && len(args) == 2:
		loop = func(ctx context.Context, conn *pgx.Conn) error { return pollFloor(ctx, conn, nil) }
	case kind == "archive" && len(args) == 2:
		loop = archiveFloor
	case kind == "publish" && len(args) == 4:
		publish, closeSink, err := floorPublisher(args[2], args[3])
		if err != nil {
			fmt.Fprintf(stderr, "relaybench -as-floor publish: %v\n", err)
			return 1
		}
		defer closeSink()
		loop = func(ctx context.Context, conn *pgx.Conn) error { return pollFloor(ctx, conn, publish) }
	default:
		fmt.Fprintf(stderr, "relaybench -as-floor: unknown floor %q with %d arguments (poll DSN, publish DSN SINK ADDRESS, archive DSN)\n", kind, len(args)-1)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Fprintf(stderr, "relaybench -as-floor %s: %v\n", kind, err)
		return 1
	}
	defer conn.Close(context.Background())
	if err := loop(ctx, conn); err != nil && ctx.Err() == nil {
		fmt.Fprintf(stderr, "relaybench -as-floor %s: %v\n", kind, err)
		return 1
	}
	return 0
}

// pollFloor deletes the outbox's oldest rows in batches of floorBatch until
// ctx ends: the next batch at once after a full one, after floorWait after
// a short one, and after a wait doubling up to floorIdle while batches
// come back empty. Unless publish is nil, it publishes each batch's rows
// before the next batch.
func pollFloor(ctx context.Context, conn *pgx.Conn, publish publishFunc) error {
	query := rawDelete("seq", floorBatch)
	var pause time.Duration
	for {
		n, err := floorDelete(ctx, conn, query, publish)
		switch {
		case err != nil:
			return err
		case n == floorBatch:
			pause = 0
		case n > 0:
			pause = floorWait
		default:
			pause = min(max(2*pause, floorWait), floorIdle)
		}
		if err := wait.Sleep(ctx, pause); err != nil {
			return err
		}
	}
}

// floorDelete runs query, a rawDelete, publishes the rows it returned
// unless publish is nil, and returns how many there were.
func floorDelete(ctx context.Context, conn *pgx.Conn, query string, publish publishFunc) (int, error) {
	if publish == nil {
		n, _, err := deleteBatch(ctx, conn, query)
		return n, err
	}
	rows, err := deleteRows(ctx, conn, query)
	if err == nil && len(rows) > 0 {
		err = publish(ctx, rows)
	}
	return len(rows), err
}

// archiveFloor deletes, every archiveEvery until ctx ends, the rows up to
// the highest seq present at the tick before: rows committed at least
// archiveEvery earlier, which pg_recvlogical has decoded by then while it
// keeps up. It is one statement per tick, like the wal relay's archive of
// the batches completed within its archive period.
func archiveFloor(ctx context.Context, conn *pgx.Conn) error {
	var bound int64
	for {
		var next *int64
		if err := conn.QueryRow(ctx, archiveFloorSQL, bound).Scan(&next); err != nil {
			return err
		}
		if next != nil {
			bound = *next
		}
		if err := wait.Sleep(ctx, archiveEvery); err != nil {
			return err
		}
	}
}

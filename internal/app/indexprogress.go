package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/progress"
)

// defaultIndexPoll is InitOptions.ProgressPoll's default.
const defaultIndexPoll = 500 * time.Millisecond

// indexSample is one row of pg_stat_progress_create_index.
type indexSample struct {
	Phase                     string
	BlocksDone, BlocksTotal   int64
	TuplesDone, TuplesTotal   int64
	LockersDone, LockersTotal int64
	LockerPID                 int64
}

// runIndexStep runs step s (an index build) on the connection with
// backend pid pid while a second connection of pool samples its progress
// every poll and reports it to rep; a build it saw ends with a line
// saying how long it took. Sampling failures only end the reporting.
func runIndexStep(ctx context.Context, pool *pgxpool.Pool, run func() error, pid uint32, rep *progress.Reporter, poll time.Duration) error {
	defer rep.Stop()
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var seen bool
	start := time.Now()
	wg.Go(func() { seen = watchIndex(wctx, pool, pid, rep, poll) })
	err := run()
	cancel()
	wg.Wait()
	if seen && err == nil {
		rep.Finish("built in " + time.Since(start).Round(time.Millisecond).String())
	}
	return err
}

// watchIndex samples the index build of backend pid every poll until ctx
// ends, reporting each sample to rep, and reports whether it saw one.
func watchIndex(ctx context.Context, pool *pgxpool.Pool, pid uint32, rep *progress.Reporter, poll time.Duration) bool {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false
	}
	defer conn.Release()
	seen := false
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		var s indexSample
		err := conn.QueryRow(ctx, `SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total,
			lockers_done, lockers_total, coalesce(current_locker_pid, 0)
			FROM pg_stat_progress_create_index WHERE pid = $1`, int64(pid)).Scan(&s.Phase,
			&s.BlocksDone, &s.BlocksTotal, &s.TuplesDone, &s.TuplesTotal, &s.LockersDone, &s.LockersTotal, &s.LockerPID)
		if err == nil {
			seen = true
			reportIndex(rep, s)
		} else if ctx.Err() != nil || !errors.Is(err, pgx.ErrNoRows) {
			return seen
		}
		select {
		case <-ctx.Done():
			return seen
		case <-t.C:
		}
	}
}

// reportIndex reports one sample: a wait names the transactions waited
// for, a scan its blocks, a sort or load its tuples.
func reportIndex(rep *progress.Reporter, s indexSample) {
	switch {
	case strings.HasPrefix(s.Phase, "waiting"):
		msg := fmt.Sprintf("%d/%d transactions done", s.LockersDone, s.LockersTotal)
		if s.LockerPID != 0 {
			msg += fmt.Sprintf(", waiting for the transaction of backend pid %d to end", s.LockerPID)
		}
		rep.Note(s.Phase, msg)
	case s.BlocksTotal > 0:
		rep.Update(s.Phase, s.BlocksDone, s.BlocksTotal, "blocks")
	case s.TuplesTotal > 0:
		rep.Update(s.Phase, s.TuplesDone, s.TuplesTotal, "tuples")
	default:
		rep.Note(s.Phase, "")
	}
}

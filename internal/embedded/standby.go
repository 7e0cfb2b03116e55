package embedded

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

var standbySeq atomic.Int64

// StartStandby builds a physical standby of p with pg_basebackup -R
// (streaming the WAL it needs, with p's binaries, which must include
// pg_basebackup), starts it on a free port and makes it p's synchronous
// standby: p's synchronous_standby_names names it, so every commit p
// acknowledges is flushed on the standby too. opts.Settings apply to the
// standby on top of StartPostgres's defaults; opts.Bin is ignored. It
// returns once the standby streams synchronously. Call Stop on both; use
// Promote to make the standby a primary.
func (p *Postgres) StartStandby(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	name := fmt.Sprintf("standby_%d", standbySeq.Add(1))
	opts.Settings = maps.Clone(opts.Settings)
	if opts.Settings == nil {
		opts.Settings = map[string]string{}
	}
	opts.Settings["cluster_name"] = name // the walreceiver's application_name
	s, err := startCluster(ctx, p.bin, opts, func(s *Postgres) error {
		err := s.run(ctx, "pg_basebackup", "-D", s.dataDir(), "-h", "127.0.0.1", "-p", strconv.Itoa(p.port),
			"-U", pgUser, "-R", "-X", "stream", "-c", "fast", "--no-sync")
		if err == nil {
			err = s.includeConfOf(p)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: start standby: %w", err)
	}
	if err := p.makeSynchronous(ctx, name); err != nil {
		_ = s.Stop()
		return nil, p.withLog(fmt.Errorf("embedded: make %s synchronous: %w", name, err))
	}
	return s, nil
}

// includeConfOf points the include line that the base backup copied from
// primary's postgresql.conf at this cluster's own embedded.conf.
func (p *Postgres) includeConfOf(primary *Postgres) error {
	path := filepath.Join(p.dataDir(), "postgresql.conf")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	from, to := confQuote(primary.confFile()), confQuote(p.confFile())
	if !strings.Contains(string(b), from) {
		return fmt.Errorf("embedded: %s does not include %s", path, from)
	}
	return os.WriteFile(path, []byte(strings.Replace(string(b), from, to, 1)), 0o600)
}

// makeSynchronous sets synchronous_standby_names to standby and waits until
// pg_stat_replication reports it as the synchronous standby.
func (p *Postgres) makeSynchronous(ctx context.Context, standby string) error {
	conn, err := pgx.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", confQuote(standby))); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pgReadyTimeout)
	defer cancel()
	for {
		var sync bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_replication
			WHERE application_name = $1 AND state = 'streaming' AND sync_state = 'sync')`, standby).Scan(&sync)
		if err != nil || sync {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("standby not streaming synchronously: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote promotes a standby (pg_ctl promote) and returns once it accepts
// writes.
func (p *Postgres) Promote(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.run(ctx, "pg_ctl", "promote", "-D", p.dataDir(), "-w", "-t", pgStartTimeout)
	return p.withLog(err)
}

// Kill stops the server as a crash would (pg_ctl stop -m immediate: no
// shutdown checkpoint, clients cut at once) and keeps its data.
func (p *Postgres) Kill(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withLog(p.stop(ctx, "immediate"))
}

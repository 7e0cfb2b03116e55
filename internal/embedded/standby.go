package embedded

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

var standbySeq atomic.Int64

// StartStandby builds a physical standby of p, starts it on a free port and
// makes it p's synchronous standby: p's synchronous_standby_names names it,
// so every commit p acknowledges is flushed on the standby too. With
// pg_basebackup among p's binaries the standby is built with pg_basebackup
// -R (streaming the WAL it needs); without it (the npm packages ship none),
// by a copy of p's data directory between pg_backup_start and
// pg_backup_stop (PostgreSQL 15 and later), streaming from p through a physical replication slot
// named after the standby (see PrimarySlot), with dbname in
// primary_conninfo, as slot synchronization needs. opts.Settings apply to
// the standby on top of StartPostgres's defaults; opts.Bin is ignored. It
// returns once the standby streams synchronously. Call Stop on both; use
// Promote to make the standby a primary.
func (p *Postgres) StartStandby(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	name := fmt.Sprintf("standby_%d", standbySeq.Add(1))
	opts.Settings = maps.Clone(opts.Settings)
	if opts.Settings == nil {
		opts.Settings = map[string]string{}
	}
	opts.Settings["cluster_name"] = name // the walreceiver's application_name
	copyData := !hasBin(p.bin, "pg_basebackup")
	if copyData {
		opts.Settings["primary_conninfo"] = fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=postgres", p.port, pgUser)
		opts.Settings["primary_slot_name"] = name
	}
	s, err := startCluster(ctx, p.bin, opts, func(s *Postgres) error {
		var err error
		if copyData {
			s.primarySlot = name
			err = s.copyBackupOf(ctx, p, name)
		} else {
			err = s.run(ctx, "pg_basebackup", "-D", s.dataDir(), "-h", "127.0.0.1", "-p", strconv.Itoa(p.port),
				"-U", pgUser, "-R", "-X", "stream", "-c", "fast", "--no-sync")
		}
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

// PrimarySlot returns the physical replication slot on the primary that a
// standby StartStandby built by copying streams through, or "".
func (p *Postgres) PrimarySlot() string { return p.primarySlot }

// hasBin reports whether dir holds an executable name.
func hasBin(dir, name string) bool {
	fi, err := os.Stat(filepath.Join(dir, name))
	return err == nil && fi.Mode()&0o111 != 0
}

// copyBackupOf fills p's data directory with a base backup of primary made
// through SQL: it creates the physical slot slot (reserving WAL at once),
// copies primary's data directory between pg_backup_start and
// pg_backup_stop, leaving out what pg_basebackup leaves out, writes the
// backup label and standby.signal. The standby fetches the WAL through the
// slot.
func (p *Postgres) copyBackupOf(ctx context.Context, primary *Postgres, slot string) error {
	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		return fmt.Errorf("create the standby's slot: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_backup_start('embedded standby', true)`); err != nil {
		return fmt.Errorf("pg_backup_start: %w", err)
	}
	copyErr := p.copyDataDir(ctx, primary.dataDir())
	var label string
	if err := conn.QueryRow(ctx, `SELECT labelfile FROM pg_backup_stop(true)`).Scan(&label); err != nil {
		return errors.Join(copyErr, fmt.Errorf("pg_backup_stop: %w", err))
	}
	if copyErr != nil {
		return copyErr
	}
	if err := p.writeOwned("backup_label", label); err != nil {
		return err
	}
	return p.writeOwned("standby.signal", "")
}

// backupExcludes are the paths, relative to the data directory, a base
// backup leaves out (as pg_basebackup does): the running server's files
// and the contents of directories the standby makes afresh.
var backupExcludes = []string{"./postmaster.pid", "./postmaster.opts", "./pg_wal/*", "./pg_replslot/*",
	"./pg_dynshmem/*", "./pg_notify/*", "./pg_serial/*", "./pg_snapshots/*", "./pg_stat_tmp/*", "./pg_subtrans/*"}

// copyDataDir copies dir into p's data directory with tar, as user
// postgres when root.
func (p *Postgres) copyDataDir(ctx context.Context, dir string) error {
	args := []string{"-C", dir, "-cf", "-"}
	for _, e := range backupExcludes {
		args = append(args, "--exclude="+e)
	}
	if b, err := p.command(ctx, "mkdir", "-m", "700", p.dataDir()).CombinedOutput(); err != nil {
		return fmt.Errorf("embedded: %w\n%s", err, b)
	}
	out := p.command(ctx, "tar", append(args, ".")...)
	in := p.command(ctx, "tar", "-C", p.dataDir(), "-xf", "-")
	pipe, err := out.StdoutPipe()
	if err != nil {
		return err
	}
	in.Stdin = pipe
	var outErr, inErr strings.Builder
	out.Stderr, in.Stderr = &outErr, &inErr
	if err := out.Start(); err != nil {
		return err
	}
	if err := in.Run(); err != nil {
		_ = out.Wait()
		return fmt.Errorf("embedded: copy the data directory: %w\n%s", err, inErr.String())
	}
	if err := out.Wait(); err != nil {
		return fmt.Errorf("embedded: copy the data directory: %w\n%s", err, outErr.String())
	}
	return nil
}

// command returns a command running name, as user postgres when root.
func (p *Postgres) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if os.Geteuid() == 0 {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", pgUser, "--", name}, args...)...)
	}
	return exec.CommandContext(ctx, name, args...)
}

// writeOwned writes a file of p's data directory, owned by user postgres
// when root.
func (p *Postgres) writeOwned(name, content string) error {
	cmd := p.command(context.Background(), "tee", filepath.Join(p.dataDir(), name))
	cmd.Stdin = strings.NewReader(content)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("embedded: write %s: %w\n%s", name, err, out)
	}
	return nil
}

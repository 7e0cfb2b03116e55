package embedded

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresOptions configures StartPostgres. The zero value is ready to use.
type PostgresOptions struct {
	// Settings are extra postgresql.conf settings, written after (and so
	// overriding) the defaults StartPostgres uses. Values are quoted for
	// the file, so pass them bare: {"work_mem": "8MB"}.
	Settings map[string]string
	// Bin is the directory holding the server binaries (initdb, pg_ctl,
	// postgres), for example PostgresBin(17). Default: the one on PATH,
	// else the newest /usr/lib/postgresql/*/bin.
	Bin string
}

// Postgres is a throwaway PostgreSQL cluster in a temporary directory,
// listening on 127.0.0.1 at a free port. Its methods are safe for concurrent
// use; lifecycle methods (Stop, Restart, StopServer, StartServer) are
// serialized.
type Postgres struct {
	bin  string // directory holding initdb, pg_ctl and postgres
	dir  string // temporary directory: data/, server.log, the unix socket
	port int

	primarySlot string // a standby's physical slot on its primary (StartStandby)

	mu       sync.Mutex
	removed  bool
	watchdog *exec.Cmd // cleans up if this process dies without Stop
	wdPipe   *os.File  // its stdin's write end, closed when this process exits
}

const (
	pgStartTimeout = "60"             // seconds pg_ctl waits for start and stop
	pgReadyTimeout = 30 * time.Second // how long to wait for a working connection
	pgUser         = "postgres"       // OS user when root, and the superuser role
)

// StartPostgres creates a cluster with initdb in a new temporary directory
// and starts it. The cluster uses wal_level=logical, 20 replication slots and
// WAL senders, 200 connections, fsync and full_page_writes off, trust
// authentication for user postgres, and the port and unix socket of Port and
// Dir; opts.Settings override these. When the process runs as root, every
// server command runs as the OS user postgres. StartPostgres returns once a
// connection works; on failure the error includes the tail of the server
// log and nothing is left behind. Call Stop when done; should the process
// end without Stop (a panic, go test -timeout, SIGKILL), a watchdog process
// stops the server and removes the directory.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = findPostgresBin(); err != nil {
			return nil, err
		}
	}
	return startCluster(ctx, bin, opts, func(p *Postgres) error {
		err := p.run(ctx, "initdb", "-D", p.dataDir(), "-U", pgUser, "--auth=trust",
			"-E", "UTF8", "--locale=C", "--no-sync")
		if err == nil {
			err = p.includeConf()
		}
		return err
	})
}

// startCluster makes the directory and the watchdog of a new cluster, lets
// makeData fill the data directory, then configures and starts it. On
// failure nothing is left behind.
func startCluster(ctx context.Context, bin string, opts PostgresOptions, makeData func(*Postgres) error) (*Postgres, error) {
	bin, err := runnableBin(bin)
	if err != nil {
		return nil, err
	}
	dir, err := makeOwnedTempDir()
	if err != nil {
		return nil, err
	}
	p := &Postgres{bin: bin, dir: dir}
	if err := p.startWatchdog(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	err = makeData(p)
	if err == nil {
		err = p.configureAndStart(ctx, opts)
	}
	if err != nil {
		err = p.withLog(err)
		_ = p.Stop()
		return nil, err
	}
	return p, nil
}

// configureAndStart writes the settings and starts the server, retrying
// with a new port when another process took the chosen one.
func (p *Postgres) configureAndStart(ctx context.Context, opts PostgresOptions) error {
	var err error
	for attempt := 0; ; attempt++ {
		if p.port, err = FreePort(); err != nil {
			return err
		}
		if err = p.writeConf(opts.Settings); err != nil {
			return err
		}
		if err = p.start(ctx); err == nil || attempt == 2 || !p.portTaken() {
			return err
		}
	}
}

// DSN returns the connection URL of database db as user postgres, for
// example postgres://postgres@127.0.0.1:5432/db?sslmode=disable; db is
// escaped as needed.
func (p *Postgres) DSN(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(pgUser), Path: "/" + db,
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), RawQuery: "sslmode=disable"}
	return u.String()
}

// Port returns the TCP port the server listens on; it stays the same across
// Restart and StopServer/StartServer.
func (p *Postgres) Port() int { return p.port }

// Bin returns the directory of the server binaries the cluster runs.
func (p *Postgres) Bin() string { return p.bin }

// Dir returns the temporary directory holding the data directory (data/),
// the server log (server.log) and the unix socket.
func (p *Postgres) Dir() string { return p.dir }

// CreateDatabase creates database name (quoted as an identifier) and returns
// its DSN. with is appended to the CREATE DATABASE statement as it is, for
// example "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE
// template0"; empty by default.
func (p *Postgres) CreateDatabase(ctx context.Context, name string, with ...string) (string, error) {
	err := p.exec(ctx, strings.Join(append([]string{"CREATE DATABASE", pgx.Identifier{name}.Sanitize()}, with...), " "))
	if err != nil {
		return "", fmt.Errorf("embedded: create database %q: %w", name, err)
	}
	return p.DSN(name), nil
}

// DropDatabase drops database name, first terminating its connections and
// dropping its replication slots so that they are free for other tests.
func (p *Postgres) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("embedded: drop database %q: %w", name, err)
	}
	defer conn.Close(ctx)
	if err := dropSlots(ctx, conn, name); err != nil {
		return fmt.Errorf("embedded: drop slots of %q: %w", name, err)
	}
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	if err != nil {
		return fmt.Errorf("embedded: drop database %q: %w", name, err)
	}
	return nil
}

// dropSlots drops the replication slots of database db, first terminating
// the walsenders using them; it retries while a terminated walsender still
// holds its slot.
func dropSlots(ctx context.Context, conn *pgx.Conn, db string) error {
	const q = `SELECT slot_name, CASE WHEN active THEN pg_terminate_backend(active_pid) END
	  FROM pg_replication_slots WHERE database = $1 AND slot_type = 'logical'`
	for i := 0; i < 100; i++ {
		var busy bool
		rows, _ := conn.Query(ctx, q, db)
		slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var name string
			var terminated *bool
			err := r.Scan(&name, &terminated)
			busy = busy || terminated != nil
			return name, err
		})
		if err != nil || len(slots) == 0 {
			return err
		}
		if !busy {
			for _, s := range slots {
				if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s); err != nil {
					return err
				}
			}
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("slots still active after 5s")
}

// Stop stops the server at once (pg_ctl stop -m immediate) and removes the
// directory. Calling it again, or after StopServer, is safe and returns nil.
func (p *Postgres) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removed {
		return nil
	}
	p.removed = true
	p.stopWatchdog()
	err := p.stop(context.Background(), "immediate")
	if rmErr := os.RemoveAll(p.dir); err == nil {
		err = rmErr
	}
	return err
}

// watchdogScript waits for EOF on stdin, which happens when the process
// holding the pipe's write end exits or closes it, then stops the server
// and removes the directory. Arguments: pg_ctl, data dir, dir.
const watchdogScript = `read -r _
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
as_owner "$1" stop -D "$2" -m immediate -w >/dev/null 2>&1
rm -rf "$3"`

// startWatchdog starts the watchdog shell in its own process group, so that
// a Ctrl-C aimed at the tests does not reach it.
func (p *Postgres) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", watchdogScript, "embedded-watchdog",
		filepath.Join(p.bin, "pg_ctl"), p.dataDir(), p.dir)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("embedded: start watchdog: %w", err)
	}
	p.watchdog, p.wdPipe = cmd, w
	return nil
}

// stopWatchdog ends the watchdog without letting it clean up.
func (p *Postgres) stopWatchdog() {
	_ = p.watchdog.Process.Kill()
	_ = p.watchdog.Wait()
	p.wdPipe.Close()
}

// Restart restarts the server with a fast shutdown (pg_ctl restart -m fast),
// keeping its data and port, and returns once a connection works. Clients
// are disconnected; it is meant for fault tests.
func (p *Postgres) Restart(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.run(ctx, "pg_ctl", "restart", "-D", p.dataDir(), "-l", p.logFile(),
		"-m", "fast", "-w", "-t", pgStartTimeout)
	if err == nil {
		err = p.waitReady(ctx)
	}
	return p.withLog(err)
}

// StopServer stops the server with a fast shutdown but keeps its data, for
// outage tests; StartServer brings it back on the same port.
func (p *Postgres) StopServer(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withLog(p.stop(ctx, "fast"))
}

// StartServer starts a server stopped by StopServer on the same port and
// returns once a connection works.
func (p *Postgres) StartServer(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withLog(p.start(ctx))
}

// start runs pg_ctl start and waits for a working connection.
func (p *Postgres) start(ctx context.Context) error {
	err := p.run(ctx, "pg_ctl", "start", "-D", p.dataDir(), "-l", p.logFile(),
		"-w", "-t", pgStartTimeout)
	if err != nil {
		return err
	}
	return p.waitReady(ctx)
}

// stop runs pg_ctl stop with the given mode; a server that is not running
// is not an error.
func (p *Postgres) stop(ctx context.Context, mode string) error {
	if _, err := os.Stat(filepath.Join(p.dataDir(), "postmaster.pid")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	err := p.run(ctx, "pg_ctl", "stop", "-D", p.dataDir(), "-m", mode, "-w", "-t", pgStartTimeout)
	if err != nil && p.run(ctx, "pg_ctl", "status", "-D", p.dataDir()) != nil {
		return nil // pg_ctl status fails when no server runs: a stale pid file
	}
	return err
}

// waitReady waits until a connection to database postgres works.
func (p *Postgres) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pgReadyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, p.DSN("postgres"))
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("embedded: postgres not ready: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exec runs one statement in database postgres.
func (p *Postgres) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }
func (p *Postgres) logFile() string { return filepath.Join(p.dir, "server.log") }
func (p *Postgres) confFile() string {
	return filepath.Join(p.dataDir(), "embedded.conf")
}

// includeConf makes postgresql.conf include embedded.conf, which writeConf
// rewrites.
func (p *Postgres) includeConf() error {
	f, err := os.OpenFile(filepath.Join(p.dataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "\ninclude '%s'\n", confQuote(p.confFile()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeConf writes the settings of the cluster to embedded.conf.
func (p *Postgres) writeConf(extra map[string]string) error {
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(p.port),
		"unix_socket_directories": p.dir,
		"wal_level":               "logical",
		"max_replication_slots":   "20",
		"max_wal_senders":         "20",
		"max_connections":         "200",
		"fsync":                   "off",
		"full_page_writes":        "off",
	}
	for k, v := range extra {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, confQuote(settings[k]))
	}
	return os.WriteFile(p.confFile(), []byte(b.String()), 0o644)
}

func confQuote(s string) string { return strings.ReplaceAll(s, "'", "''") }

// portTaken reports whether the server log says the port was in use.
func (p *Postgres) portTaken() bool {
	return strings.Contains(p.logTail(), "Address already in use")
}

// run runs one of the PostgreSQL binaries, as user postgres when root.
func (p *Postgres) run(ctx context.Context, name string, args ...string) error {
	path := filepath.Join(p.bin, name)
	cmd := exec.CommandContext(ctx, path, args...)
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", pgUser, "--", path}, args...)...)
	}
	cmd.Dir = p.dir
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("embedded: %s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// withLog appends the tail of the server log to a non-nil err.
func (p *Postgres) withLog(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w\n--- tail of %s ---\n%s", err, p.logFile(), p.logTail())
}

// logTail returns the last 30 lines of the server log.
func (p *Postgres) logTail() string {
	b, err := os.ReadFile(p.logFile())
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// findPostgresBin returns the directory of pg_ctl and initdb: the one on
// PATH (symlinks resolved), else the newest /usr/lib/postgresql/*/bin.
func findPostgresBin() (string, error) {
	if path, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil && hasInitdb(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if hasInitdb(d) {
			return d, nil
		}
	}
	return "", errors.New("embedded: PostgreSQL server binaries (initdb, pg_ctl) not found on PATH " +
		"or in /usr/lib/postgresql/*/bin; run scripts/deps.sh")
}

func hasInitdb(dir string) bool {
	_, err1 := os.Stat(filepath.Join(dir, "initdb"))
	_, err2 := os.Stat(filepath.Join(dir, "pg_ctl"))
	return err1 == nil && err2 == nil
}

// pgVersion returns the version in /usr/lib/postgresql/VERSION/bin.
func pgVersion(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// makeOwnedTempDir makes a temporary directory, owned by user postgres when
// the process runs as root.
func makeOwnedTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "relay-pg-")
	if err != nil || os.Geteuid() != 0 {
		return dir, err
	}
	u, err := user.Lookup(pgUser)
	if err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		err = os.Chown(dir, uid, gid)
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("embedded: running as root needs OS user %s: %w", pgUser, err)
	}
	return dir, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. It
// picks from 20000–32767, below Linux's ephemeral range, so that an
// outgoing connection opened before the caller binds cannot take it.
func FreePort() (int, error) {
	var err error
	for range 100 {
		port := 20000 + rand.IntN(12768)
		var l net.Listener
		if l, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, err
}

// Package pgtest runs a throwaway PostgreSQL cluster for the helpers' tests:
// Main starts one per test binary with initdb and postgres from
// /usr/lib/postgresql/*/bin (or PATH), as the OS user postgres when the tests
// run as root, and NewDB gives each test its own database in it.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The cluster, set by start.
var (
	mu     sync.Mutex    // guards the cluster against a stop during start
	dir    string        // temporary directory: data/, server.log, the unix socket
	port   int           // the server's TCP port
	srv    *exec.Cmd     // the running postgres
	exited chan struct{} // closed when srv exited
	dbSeq  atomic.Int64
)

// Main starts the cluster, runs the tests and stops it, also when the test
// binary is interrupted (SIGINT, SIGTERM). A cluster that cannot start fails
// the run with the reason; no test is skipped.
func Main(m *testing.M) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; stop(); os.Exit(1) }()
	if err := start(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest: start PostgreSQL:", err)
		stop()
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// stop stops the server, if it runs, and removes the directory.
func stop() {
	mu.Lock()
	defer mu.Unlock()
	if srv != nil {
		_ = srv.Process.Signal(syscall.SIGQUIT) // immediate shutdown
		<-exited
		srv = nil
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// DSN returns the URL of database db on the cluster, as user postgres.
func DSN(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/" + db,
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), RawQuery: "sslmode=disable"}
	return u.String()
}

// NewDB creates a new database, dropped when the test ends, and returns its
// DSN.
func NewDB(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", dbSeq.Add(1))
	ctx := context.Background()
	if err := exec1(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := exec1(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	return DSN(name)
}

// exec1 runs one statement in database postgres.
func exec1(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, DSN("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// start creates the cluster and starts postgres as a child process that the
// kernel kills should this process die first.
func start() error {
	mu.Lock()
	defer mu.Unlock()
	bin, err := binDir()
	if err != nil {
		return err
	}
	if dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		return err
	}
	cred, err := credential()
	if err == nil && cred != nil {
		err = os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	if err == nil {
		err = command(cred, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
			"-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync").Run()
	}
	for attempt := 0; err == nil; attempt++ {
		if err = serve(bin, cred); err == nil || attempt == 2 {
			return err
		}
		err = nil // another process took the port: try another one
	}
	return err
}

// serve starts postgres on a free port and waits until it accepts
// connections.
func serve(bin string, cred *syscall.Credential) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := command(cred, filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200",
		"-c", "wal_level=logical") // the outbox helper's test decodes its messages
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), DSN("postgres"))
		if err == nil {
			conn.Close(context.Background())
			srv, exited = cmd, done
			return nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("postgres exited: %s", b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("postgres not ready after 60s: %w", err)
		}
	}
}

// command returns a command running as cred (nil: this process's user),
// and killed (SIGKILL) should the thread that started it end, which for
// Main is when the test binary dies.
func command(cred *syscall.Credential, path string, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// credential returns the OS user postgres when running as root, and nil
// otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs OS user postgres: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// binDir returns the directory of initdb and postgres: the one on PATH, else
// the newest /usr/lib/postgresql/*/bin.
func binDir() (string, error) {
	if path, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(path); err == nil {
			return filepath.Dir(real), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found on PATH " +
		"or in /usr/lib/postgresql/*/bin; install them (scripts/deps.sh in the repository)")
}

// version returns the version in /usr/lib/postgresql/VERSION/bin.
func version(bin string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bin)), 64)
	return v
}

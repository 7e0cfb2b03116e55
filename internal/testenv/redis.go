package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/embedded"
)

// RedisServerBin is the redis-server of the Debian package redis-server,
// which scripts/deps.sh installs.
const RedisServerBin = "/usr/bin/redis-server"

// RedisOptions configures a redis-server started by StartRedis. The zero
// value is a server without persistence, authentication or TLS.
type RedisOptions struct {
	// Persist turns the append-only file on (appendfsync always), so that
	// what the server acknowledged survives Stop and Start. Default false:
	// the data is lost when the server stops.
	Persist bool
	// TLSCert and TLSKey, when set, make the server speak TLS only on its
	// port, with TLSCert as the CA too; clients need no certificate.
	TLSCert, TLSKey string
	// Cluster starts the server in cluster mode (a node of its own; the
	// test assigns it slots with CLUSTER ADDSLOTSRANGE).
	Cluster bool
	// SentinelOf, when set, starts a Sentinel instead of a server,
	// monitoring the master at this host:port under the name "mymaster"
	// with a quorum of 1.
	SentinelOf string
	// Args are more redis-server arguments, such as "--maxmemory", "1mb".
	Args []string
}

// Redis is a redis-server process (or a Sentinel) (/usr/bin/redis-server) listening on
// 127.0.0.1 and a free port, with its files in a temporary directory. It
// keeps its port across Stop and Start. Its methods are safe for
// concurrent use.
type Redis struct {
	dir  string
	port int
	opts RedisOptions

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil while stopped
	done chan struct{} // closed when cmd exited
	log  *SyncBuffer   // the current process's log
}

// StartRedis starts redis-server with o and returns once it accepts
// clients. t's cleanup stops it; the process also dies with the test
// binary (Pdeathsig).
func StartRedis(t testing.TB, o RedisOptions) *Redis {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &Redis{dir: t.TempDir(), port: port, opts: o}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Addr returns the server's host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// URL returns redis://127.0.0.1:PORT/0, or rediss:// with TLS.
func (r *Redis) URL() string {
	scheme := "redis"
	if r.opts.TLSCert != "" {
		scheme = "rediss"
	}
	return scheme + "://" + r.Addr() + "/0"
}

// Log returns what the running (or last) server process logged.
func (r *Redis) Log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.log == nil {
		return ""
	}
	return r.log.String()
}

// args returns the command line of the server. A Sentinel's configuration
// file, which it rewrites, is written first.
func (r *Redis) args() ([]string, error) {
	if m := r.opts.SentinelOf; m != "" {
		host, port, _ := strings.Cut(m, ":")
		conf := filepath.Join(r.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte("sentinel monitor mymaster "+host+" "+port+" 1\n"), 0o600); err != nil {
			return nil, err
		}
		return []string{conf, "--sentinel", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir, "--logfile", ""}, nil
	}
	a := []string{"--bind", "127.0.0.1", "--dir", r.dir, "--save", "", "--daemonize", "no",
		"--protected-mode", "no", "--logfile", "", "--loglevel", "notice"}
	if r.opts.Persist {
		a = append(a, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		a = append(a, "--appendonly", "no")
	}
	if r.opts.TLSCert != "" {
		a = append(a, "--port", "0", "--tls-port", strconv.Itoa(r.port), "--tls-cert-file", r.opts.TLSCert,
			"--tls-key-file", r.opts.TLSKey, "--tls-ca-cert-file", r.opts.TLSCert, "--tls-auth-clients", "no")
	} else {
		a = append(a, "--port", strconv.Itoa(r.port))
	}
	if r.opts.Cluster {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(r.dir, "nodes.conf"))
	}
	return append(a, r.opts.Args...), nil
}

// Start starts a stopped server again on its port and waits until it
// accepts clients (after loading its append-only file). Starting a running
// server does nothing.
func (r *Redis) Start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return nil
	}
	args, err := r.args()
	if err != nil {
		return err
	}
	ready := "Ready to accept connections"
	if r.opts.SentinelOf != "" {
		ready = "+monitor master"
	}
	log := &SyncBuffer{}
	cmd := exec.Command(RedisServerBin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start redis-server (install the redis-server package: scripts/deps.sh): %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.cmd, r.done, r.log = cmd, done, log
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(log.String(), ready); time.Sleep(10 * time.Millisecond) {
		select {
		case <-done:
			r.cmd = nil
			return fmt.Errorf("testenv: redis-server exited (%v):\n%s", cmd.ProcessState, log.String())
		default:
		}
		if time.Now().After(deadline) {
			r.stopLocked()
			return errors.New("testenv: redis-server not ready within 30s:\n" + log.String())
		}
	}
	return nil
}

// Stop shuts the server down (SIGTERM: it closes every connection and,
// with Persist, flushes its append-only file) and waits for it to exit,
// killing it after 10 seconds. Stopping a stopped server does nothing.
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked()
}

func (r *Redis) stopLocked() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
	r.cmd = nil
}

// Restart stops the server and starts it again on the same port.
func (r *Redis) Restart() error {
	r.Stop()
	return r.Start()
}

package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsModule is the module path of the NATS server, a main package.
const natsModule = "github.com/nats-io/nats-server/v2"

// NATSProcess is a JetStream nats-server running as a process of its own,
// built (without the race detector) from the nats-server module the relay
// requires. Tests that reload the server's configuration use it instead of
// the embedded NATS: the embedded server's ReloadOptions has data races of
// its own, which the race detector would report as the test's. Its methods
// are safe for concurrent use.
type NATSProcess struct {
	dir  string // holds the configuration file and the JetStream store
	port int
	cmd  *exec.Cmd
	log  SyncBuffer // the server's own log (stderr)
	done chan struct{}
	mu   sync.Mutex // serializes Reload
}

// StartNATSProcess starts nats-server with JetStream on 127.0.0.1 and a free
// port, with conf (nats-server configuration text, such as an authorization
// block) added to its configuration, and waits until it accepts clients. It
// builds the server binary first if the user cache does not hold it for the
// required version yet. t's cleanup stops the server and removes its files.
func StartNATSProcess(t testing.TB, conf string) *NATSProcess {
	t.Helper()
	bin := natsServerBinary(t)
	p := &NATSProcess{dir: t.TempDir(), port: -1, done: make(chan struct{})}
	if err := p.writeConfig(conf); err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "-c", p.configPath())
	p.cmd.Stderr = &p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	p.waitLog(t, "Server is ready", 60*time.Second)
	m := regexp.MustCompile(`Listening for client connections on 127\.0\.0\.1:(\d+)`).FindStringSubmatch(p.log.String())
	if m == nil {
		t.Fatalf("nats-server: no client port in its log:\n%s", p.log.String())
	}
	p.port, _ = strconv.Atoi(m[1])
	if err := p.writeConfig(conf); err != nil { // a reload must keep the port
		t.Fatal(err)
	}
	return p
}

// URL returns the client URL, nats://127.0.0.1:PORT.
func (p *NATSProcess) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.port) }

// Log returns what the server logged so far.
func (p *NATSProcess) Log() string { return p.log.String() }

// Reload replaces the conf part of the server's configuration, signals the
// server to reload it (as nats-server --signal reload does) and waits until
// the server logs that it did; it returns the server's error when the
// reload failed. Clients whose credentials no longer hold are disconnected.
func (p *NATSProcess) Reload(conf string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := strings.Count(p.log.String(), "Reloaded server configuration")
	failed := strings.Count(p.log.String(), "Failed to reload server configuration")
	if err := p.writeConfig(conf); err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return fmt.Errorf("nats-server: reload: %w", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		log := p.log.String()
		switch {
		case strings.Count(log, "Reloaded server configuration") > before:
			return nil
		case strings.Count(log, "Failed to reload server configuration") > failed:
			return fmt.Errorf("nats-server: reload failed:\n%s", log)
		case time.Now().After(deadline):
			return fmt.Errorf("nats-server: no reload within 30s:\n%s", log)
		}
	}
}

func (p *NATSProcess) configPath() string { return filepath.Join(p.dir, "nats.conf") }

// writeConfig writes the configuration file with conf added.
func (p *NATSProcess) writeConfig(conf string) error {
	text := fmt.Sprintf("server_name: relay-test\nhost: 127.0.0.1\nport: %d\njetstream { store_dir: %q }\n%s\n",
		p.port, filepath.Join(p.dir, "jetstream"), conf)
	return os.WriteFile(p.configPath(), []byte(text), 0o600)
}

// waitLog waits until the server's log holds line, failing the test when
// the server exits or d passes first.
func (p *NATSProcess) waitLog(t testing.TB, line string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); !strings.Contains(p.log.String(), line); time.Sleep(20 * time.Millisecond) {
		select {
		case <-p.done:
			t.Fatalf("nats-server exited (%v) before logging %q:\n%s", p.cmd.ProcessState, line, p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server: no %q within %s:\n%s", line, d, p.log.String())
		}
	}
}

// stop asks the server to shut down and kills it after 10 seconds.
func (p *NATSProcess) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

var natsBuild struct {
	once sync.Once
	bin  string
	err  error
}

// natsServerBinary returns the path of a nats-server executable of the
// version the relay requires, built once per user into its cache directory
// (relay-test/nats-server-VERSION) with the go command, from the module
// cache.
func natsServerBinary(t testing.TB) string {
	t.Helper()
	natsBuild.once.Do(func() { natsBuild.bin, natsBuild.err = buildNATSServer() })
	if natsBuild.err != nil {
		t.Fatal(natsBuild.err)
	}
	return natsBuild.bin
}

func buildNATSServer() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "relay-test")
	bin := filepath.Join(dir, "nats-server-"+server.VERSION)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, "nats-server-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	// The go command builds the version go.mod requires: server.VERSION.
	built := filepath.Join(tmp, "nats-server")
	if out, err := exec.Command("go", "build", "-o", built, natsModule).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nats-server %s: %v\n%s", server.VERSION, err, out)
	}
	return bin, os.Rename(built, bin) // atomic: another test process may build it at the same time
}

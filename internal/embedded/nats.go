package embedded

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSLogEnv names the environment variable that, set to 1, makes the
// embedded NATS server log to stderr. By default it logs nothing.
const NATSLogEnv = "RELAY_TEST_NATS_LOG"

// NATSOptions tunes the embedded NATS server.
type NATSOptions struct {
	// MaxPayload is the largest message the server accepts, in bytes,
	// headers included. Zero keeps the server default of 1 MiB.
	MaxPayload int32
	// Configure, when set, changes the server's options before it first
	// starts: users, TLS, operator mode. Host, Port and StoreDir must stay.
	Configure func(*server.Options)
}

// NATS is an embedded NATS server with JetStream enabled, listening on a free
// loopback port and storing its streams in a temporary directory. Its methods
// are safe for concurrent use.
type NATS struct {
	mu     sync.Mutex
	opts   server.Options
	srv    *server.Server // nil while stopped
	closed bool
}

// StartNATS starts an embedded NATS server with JetStream enabled on
// 127.0.0.1 and a free port. The caller must call Shutdown.
func StartNATS(opts NATSOptions) (*NATS, error) {
	dir, err := os.MkdirTemp("", "relay-nats-")
	if err != nil {
		return nil, fmt.Errorf("nats store dir: %w", err)
	}
	n := &NATS{opts: server.Options{
		ServerName: "relay-test",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   dir,
		MaxPayload: opts.MaxPayload,
		NoSigs:     true,
		NoLog:      os.Getenv(NATSLogEnv) != "1",
	}}
	if opts.Configure != nil {
		opts.Configure(&n.opts)
	}
	if err := n.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return n, nil
}

// URL returns the client URL, nats://127.0.0.1:PORT. It stays the same
// across Stop, Start and Restart.
func (n *NATS) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("nats://%s", net.JoinHostPort(n.opts.Host, fmt.Sprint(n.opts.Port)))
}

// Start starts a stopped server again on the same port with the same store
// directory, so streams and their messages survive. Starting a running
// server does nothing.
func (n *NATS) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("nats test server: start after shutdown")
	}
	if n.srv != nil {
		return nil
	}
	opts := n.opts // NewServer keeps and changes the options it is given.
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("nats test server: %w", err)
	}
	srv.ConfigureLogger()
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("nats test server on port %d: not ready after 10s", n.opts.Port)
	}
	n.opts.Port = srv.Addr().(*net.TCPAddr).Port
	n.srv = srv
	return nil
}

// Stop shuts the server down and keeps its store directory, for outage
// tests; Start brings it back. Stopping a stopped server does nothing.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stop()
}

func (n *NATS) stop() {
	if n.srv == nil {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.srv = nil
}

// Restart stops the server and starts a new one on the same port with the
// same store directory, like a broker restart.
func (n *NATS) Restart() error {
	n.Stop()
	return n.Start()
}

// Shutdown stops the server and removes its store directory. It is safe to
// call more than once.
func (n *NATS) Shutdown() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.stop()
	n.closed = true
	os.RemoveAll(n.opts.StoreDir)
}

package testenv

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The RabbitMQ node: the Debian package rabbitmq-server (scripts/deps.sh
// installs it), run as the current user through its own start script, not
// the package's wrapper, which would switch to the rabbitmq user.
const (
	rabbitMQServer = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	// rabbitMQStartTimeout bounds the wait for a node to accept AMQP
	// clients; a node boots in seconds, but took over 90 s in a full
	// test run with both cores busy.
	rabbitMQStartTimeout = 3 * time.Minute
)

// RabbitMQUser is a user a node is started with, with its permissions in
// one virtual host (regular expressions over resource names, as
// rabbitmqctl set_permissions takes them).
type RabbitMQUser struct {
	Name, Password string
	// Tags such as "administrator"; default none.
	Tags string
	// VHost is where the permissions apply; default "/".
	VHost                  string
	Configure, Write, Read string
}

// RabbitMQOptions configures a node StartRabbitMQ starts. The zero value is
// the user guest (password guest, every permission on "/") and the
// package's defaults.
type RabbitMQOptions struct {
	// Conf holds extra rabbitmq.conf lines, such as
	// "max_message_size = 262144".
	Conf string
	// Users are created at boot besides guest.
	Users []RabbitMQUser
	// VHosts are created at boot besides "/"; guest has every permission
	// on each.
	VHosts []string
	// TLS adds an AMQPS listener (TLSAddr) with a self-signed certificate
	// for 127.0.0.1 the node makes (CAFile); it asks clients for no
	// certificate. Default off.
	TLS bool
}

// RabbitMQ is a RabbitMQ node running as a child process group on
// 127.0.0.1 and free ports, with its own node name, Erlang cookie, epmd,
// database and logs in a temporary directory. Its methods are safe for
// concurrent use.
type RabbitMQ struct {
	dir     string
	port    int
	tlsPort int // 0 without a TLS listener
	cmd     *exec.Cmd
	epmd    *exec.Cmd
	log     *tailBuffer
	done    chan struct{}
	stopd   chan struct{} // closed by Shutdown
}

// StartRabbitMQ starts a node and returns once it accepts AMQP
// connections. The caller must call Shutdown (t.Cleanup, or at the end of
// TestMain for a node a test binary shares), which kills the node and its
// epmd and removes its files.
func StartRabbitMQ(o RabbitMQOptions) (*RabbitMQ, error) {
	if _, err := os.Stat(rabbitMQServer); err != nil {
		return nil, fmt.Errorf("testenv: rabbitmq-server is not installed (scripts/deps.sh installs it): %w", err)
	}
	dir, err := os.MkdirTemp("", "relay-rabbitmq-")
	if err != nil {
		return nil, err
	}
	r := &RabbitMQ{dir: dir, log: &tailBuffer{max: 8 << 10}, done: make(chan struct{}), stopd: make(chan struct{})}
	if err := r.start(o); err != nil {
		r.Shutdown()
		return nil, fmt.Errorf("testenv: rabbitmq: %w\n%s", err, r.log.String())
	}
	return r, nil
}

func (r *RabbitMQ) start(o RabbitMQOptions) error {
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	r.port = ports[0]
	defs, err := rabbitDefinitions(o)
	if err != nil {
		return err
	}
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\nload_definitions = %s\n%s\n",
		r.port, filepath.Join(r.dir, "definitions.json"), o.Conf)
	if o.TLS {
		r.tlsPort = ports[3]
		tlsConf, err := r.tlsConf()
		if err != nil {
			return err
		}
		conf += tlsConf
	}
	files := map[string]string{
		"rabbitmq.conf":     conf,
		"definitions.json":  defs,
		"enabled_plugins":   "[].\n",
		"rabbitmq-env.conf": "",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	env := append(os.Environ(),
		"HOME="+r.dir, // the Erlang cookie
		"ERL_EPMD_PORT="+strconv.Itoa(ports[2]),
		fmt.Sprintf("RABBITMQ_NODENAME=relaytest-%d@localhost", r.port),
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[1]),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
		"RABBITMQ_LOGS=-",
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r.dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(r.dir, "rabbitmq.pid"),
		// Idle Erlang schedulers spin before they sleep by default, which
		// takes CPU from the other tests on a small machine.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+sbwt none +sbwtdcpu none +sbwtdio none",
	)
	// An epmd of the node's own, in the foreground, so that no daemon
	// outlives the tests: the node finds it running and starts none.
	r.epmd = exec.Command("epmd", "-address", "127.0.0.1", "-port", strconv.Itoa(ports[2]))
	r.epmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.epmd.Start(); err != nil {
		return fmt.Errorf("start epmd: %w", err)
	}
	r.cmd = exec.Command(rabbitMQServer)
	r.cmd.Dir, r.cmd.Env = r.dir, env
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	return r.waitAMQP()
}

// tlsConf writes the node's certificate and returns the rabbitmq.conf
// lines of its TLS listener.
func (r *RabbitMQ) tlsConf() (string, error) {
	certFile, keyFile, _, err := writeCert(r.dir)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("listeners.ssl.default = 127.0.0.1:%d\nssl_options.cacertfile = %s\nssl_options.certfile = %s\nssl_options.keyfile = %s\nssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n",
		r.tlsPort, certFile, certFile, keyFile), nil
}

// waitAMQP waits until the node answers an AMQP protocol header with its
// connection.start method frame, and accepts connections on its TLS
// listener when it has one.
func (r *RabbitMQ) waitAMQP() error {
	deadline := time.Now().Add(rabbitMQStartTimeout)
	for {
		err := amqpHello(r.Addr())
		if err == nil && r.tlsPort != 0 {
			err = tlsHello(r.TLSAddr())
		}
		if err == nil {
			return nil
		}
		select {
		case <-r.done:
			return errors.New("the node exited while starting")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no AMQP answer after %v: %w", rabbitMQStartTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// amqpHello sends the AMQP 0-9-1 protocol header to addr and reads the
// first byte of the answer, 1 for a method frame.
func amqpHello(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if b[0] != 1 {
		return fmt.Errorf("answered the protocol header with frame type %d", b[0])
	}
	return nil
}

// tlsHello completes a TLS handshake with addr, trusting any certificate.
func tlsHello(addr string) error {
	d := &net.Dialer{Timeout: time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		return err
	}
	return c.Close()
}

// rabbitDefinitions returns the definitions file the node imports at boot:
// guest and o's users and virtual hosts.
func rabbitDefinitions(o RabbitMQOptions) (string, error) {
	type user struct {
		Name         string `json:"name"`
		PasswordHash string `json:"password_hash"`
		Algorithm    string `json:"hashing_algorithm"`
		Tags         string `json:"tags"`
	}
	type perm struct {
		User      string `json:"user"`
		VHost     string `json:"vhost"`
		Configure string `json:"configure"`
		Write     string `json:"write"`
		Read      string `json:"read"`
	}
	type vhost struct {
		Name string `json:"name"`
	}
	var defs struct {
		Users       []user  `json:"users"`
		VHosts      []vhost `json:"vhosts"`
		Permissions []perm  `json:"permissions"`
	}
	all := append([]RabbitMQUser{{Name: "guest", Password: "guest", Tags: "administrator", Configure: ".*", Write: ".*", Read: ".*"}}, o.Users...)
	for _, v := range append([]string{"/"}, o.VHosts...) {
		defs.VHosts = append(defs.VHosts, vhost{v})
		if v != "/" {
			defs.Permissions = append(defs.Permissions, perm{"guest", v, ".*", ".*", ".*"})
		}
	}
	for _, u := range all {
		salt := make([]byte, 4)
		rand.Read(salt)
		sum := sha256.Sum256(append(append([]byte{}, salt...), u.Password...))
		defs.Users = append(defs.Users, user{u.Name, base64.StdEncoding.EncodeToString(append(salt, sum[:]...)), "rabbit_password_hashing_sha256", u.Tags})
		vh := u.VHost
		if vh == "" {
			vh = "/"
		}
		defs.Permissions = append(defs.Permissions, perm{u.Name, vh, u.Configure, u.Write, u.Read})
	}
	b, err := json.Marshal(defs)
	return string(b), err
}

// freePorts returns n distinct free TCP ports of 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Addr returns the node's AMQP address, 127.0.0.1:PORT.
func (r *RabbitMQ) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// TLSAddr returns the address of the node's TLS listener, 127.0.0.1:PORT,
// or "" when it has none (RabbitMQOptions.TLS).
func (r *RabbitMQ) TLSAddr() string {
	if r.tlsPort == 0 {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(r.tlsPort)
}

// CAFile returns the PEM file of the certificate of the node's TLS
// listener, which is its own CA.
func (r *RabbitMQ) CAFile() string { return filepath.Join(r.dir, "cert.pem") }

// URL returns an amqp:// URL for user and password on the virtual host
// "/".
func (r *RabbitMQ) URL(user, password string) string {
	return fmt.Sprintf("amqp://%s:%s@%s/", user, password, r.Addr())
}

// Log returns the last 8 KiB the node logged.
func (r *RabbitMQ) Log() string { return r.log.String() }

// Shutdown kills the node's process group and its epmd, waits for them and
// removes the node's files. It is safe to call more than once.
func (r *RabbitMQ) Shutdown() {
	select {
	case <-r.stopd:
		return
	default:
		close(r.stopd)
	}
	if r.cmd != nil && r.cmd.Process != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
		}
	}
	if r.epmd != nil && r.epmd.Process != nil {
		_ = syscall.Kill(-r.epmd.Process.Pid, syscall.SIGKILL)
		r.epmd.Wait()
	}
	if !strings.HasPrefix(r.dir, os.TempDir()) {
		return
	}
	os.RemoveAll(r.dir)
}

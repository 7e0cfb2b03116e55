package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxrelay/relay/internal/embedded"
)

// The SQS emulator: the npm package local-aws-sqs, a Node.js SQS server
// speaking both the JSON and the Query protocol, with FIFO queues, message
// deduplication, message attributes and batches. scripts/deps.sh installs
// it into embedded.CacheDir; StartSQS installs it there too when it is missing.
const (
	// SQSEmulatorPackage is the npm package of the emulator.
	SQSEmulatorPackage = "local-aws-sqs"
	// SQSEmulatorVersion is the version StartSQS installs and runs; keep it
	// in step with scripts/deps.sh.
	SQSEmulatorVersion = "2.0.2"
	// SQSLogEnv names the environment variable that, set to 1, passes the
	// emulator's stderr through to the test's stderr.
	SQSLogEnv = "RELAY_TEST_SQS_LOG"
)

// sqsStartTimeout bounds the wait for the emulator to answer after its
// process started.
const sqsStartTimeout = 20 * time.Second

// sqsLauncher starts the emulator on RELAY_SQS_PORT (0 for a free one) with
// the queues of RELAY_SQS_QUEUES, prints "LISTENING <port>" and exits when
// its stdin reaches EOF, which happens when the test process dies, so an
// emulator never outlives its tests.
const sqsLauncher = `
const { createSqsServer } = require(process.env.RELAY_SQS_MODULE);
const fail = (e) => { console.error(e && e.stack || e); process.exit(1); };
process.on("uncaughtException", fail);
createSqsServer({
  port: Number(process.env.RELAY_SQS_PORT || 0),
  hostname: "127.0.0.1",
  region: "us-east-1",
  emulateQueueCreationLifecycle: false,
  queues: JSON.parse(process.env.RELAY_SQS_QUEUES || "[]"),
}).then((srv) => {
  process.stdout.write("LISTENING " + srv.address().port + "\n");
}, fail);
process.stdin.on("end", () => process.exit(0));
process.stdin.on("close", () => process.exit(0));
process.stdin.resume();
`

// SQS is a local-aws-sqs emulator running as a child process (in its own
// process group) on 127.0.0.1 and a free port. It keeps queues and messages
// in memory only: Stop remembers the queues (names and attributes) and
// Start creates them again, but messages do not survive a Stop. Its methods
// are safe for concurrent use.
type SQS struct {
	module string // the package directory, required by the launcher

	mu     sync.Mutex
	port   int
	cmd    *exec.Cmd // nil while stopped
	stdin  io.WriteCloser
	exited chan struct{} // closed when cmd exited
	stderr *tailBuffer
	queues []sqsQueue // created again by Start
	closed bool
}

// sqsQueue is a queue as CreateQueue takes it.
type sqsQueue struct {
	QueueName  string            `json:"QueueName"`
	Attributes map[string]string `json:"Attributes,omitempty"`
}

// StartSQS installs the emulator when it is missing (see EnsureSQSEmulator),
// starts it on a free port and returns once it answers requests. It fails
// with the reason when Node.js or npm are missing. The caller must call
// Shutdown (t.Cleanup(s.Shutdown), or OnExit for an emulator shared by a
// test binary).
func StartSQS() (*SQS, error) {
	module, err := EnsureSQSEmulator()
	if err != nil {
		return nil, err
	}
	s := &SQS{module: module}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Endpoint returns the emulator's URL, http://127.0.0.1:PORT, for the SQS
// client's endpoint setting. It stays the same across Stop and Start.
func (s *SQS) Endpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://127.0.0.1:" + strconv.Itoa(s.port)
}

// Port returns the TCP port of the emulator.
func (s *SQS) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Start starts a stopped emulator again on the same port, with the queues
// it had when it was stopped (empty), and returns once it answers. The
// first Start picks a free port. Starting a running emulator does nothing.
func (s *SQS) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("testenv: sqs emulator: start after shutdown")
	}
	if s.cmd != nil {
		return nil
	}
	queues, err := json.Marshal(s.queues)
	if err != nil {
		return err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return errNoNode
	}
	cmd := exec.Command(node, "-e", sqsLauncher)
	cmd.Env = append(os.Environ(),
		"RELAY_SQS_MODULE="+s.module,
		"RELAY_SQS_PORT="+strconv.Itoa(s.port),
		"RELAY_SQS_QUEUES="+string(queues),
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	tail := &tailBuffer{max: 8 << 10}
	cmd.Stderr = tail
	if os.Getenv(SQSLogEnv) == "1" {
		cmd.Stderr = io.MultiWriter(tail, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: start sqs emulator: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.stdin, s.exited, s.stderr = cmd, stdin, exited, tail

	port, err := readListening(stdout)
	if err == nil {
		s.port = port
		err = waitSQSReady(s.endpoint(), exited)
	}
	if err != nil {
		s.kill()
		return fmt.Errorf("testenv: sqs emulator: %w\n--- emulator stderr ---\n%s", err, tail.String())
	}
	go io.Copy(io.Discard, stdout)
	return nil
}

var errNoNode = errors.New("testenv: node (Node.js) not found on PATH; the SQS emulator " +
	SQSEmulatorPackage + " needs it: run scripts/deps.sh (or apt-get install nodejs npm)")

func (s *SQS) endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// readListening reads the launcher's "LISTENING <port>" line.
func readListening(stdout io.Reader) (int, error) {
	type result struct {
		port int
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			ch <- result{err: fmt.Errorf("no LISTENING line (process exited?): %w", err)}
			return
		}
		port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "LISTENING ")))
		if err != nil {
			err = fmt.Errorf("unexpected output %q", line)
		}
		ch <- result{port, err}
	}()
	select {
	case r := <-ch:
		return r.port, r.err
	case <-time.After(sqsStartTimeout):
		return 0, fmt.Errorf("not listening after %v", sqsStartTimeout)
	}
}

// waitSQSReady waits until ListQueues answers.
func waitSQSReady(endpoint string, exited <-chan struct{}) error {
	deadline := time.Now().Add(sqsStartTimeout)
	for {
		err := sqsCall(endpoint, "ListQueues", map[string]any{}, nil)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before answering: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not answering after %v: %w", sqsStartTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop remembers the emulator's queues, then kills it (SIGKILL to its
// process group), for outage tests; Start brings it back on the same port.
// The queues' messages are lost. Stopping a stopped emulator does nothing.
func (s *SQS) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	queues, err := s.snapshot()
	s.kill()
	if err != nil {
		return fmt.Errorf("testenv: sqs emulator: remember queues: %w", err)
	}
	s.queues = queues
	return nil
}

// Restart stops the emulator and starts it again on the same port, with
// its queues but without their messages.
func (s *SQS) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	return s.Start()
}

// Shutdown kills the emulator and its process group. It is safe to call
// more than once.
func (s *SQS) Shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.kill()
}

// kill ends the process group and waits for the process.
func (s *SQS) kill() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	s.stdin.Close()
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
	s.cmd = nil
}

// Stderr returns the last 8 KiB the emulator wrote to stderr.
func (s *SQS) Stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stderr == nil {
		return ""
	}
	return s.stderr.String()
}

// sqsKeptAttributes are the queue attributes Stop remembers: those
// CreateQueue accepts.
var sqsKeptAttributes = []string{
	"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit",
	"MaximumMessageSize", "VisibilityTimeout", "DelaySeconds", "MessageRetentionPeriod",
	"ReceiveMessageWaitTimeSeconds",
}

// snapshot lists the queues with the attributes CreateQueue takes.
func (s *SQS) snapshot() ([]sqsQueue, error) {
	var list struct{ QueueUrls []string }
	if err := sqsCall(s.endpoint(), "ListQueues", map[string]any{"MaxResults": 1000}, &list); err != nil {
		return nil, err
	}
	var out []sqsQueue
	for _, u := range list.QueueUrls {
		var attrs struct{ Attributes map[string]string }
		err := sqsCall(s.endpoint(), "GetQueueAttributes", map[string]any{"QueueUrl": u, "AttributeNames": []string{"All"}}, &attrs)
		if err != nil {
			return nil, err
		}
		q := sqsQueue{QueueName: u[strings.LastIndexByte(u, '/')+1:], Attributes: map[string]string{}}
		for _, k := range sqsKeptAttributes {
			if v, ok := attrs.Attributes[k]; ok {
				q.Attributes[k] = v
			}
		}
		out = append(out, q)
	}
	return out, nil
}

// CreateQueue creates queue name with attrs (such as {"FifoQueue": "true"})
// and returns its URL. It is a convenience for tests that do not use an
// SQS client.
func (s *SQS) CreateQueue(name string, attrs map[string]string) (string, error) {
	var out struct{ QueueUrl string }
	err := sqsCall(s.Endpoint(), "CreateQueue", map[string]any{"QueueName": name, "Attributes": attrs}, &out)
	if err != nil {
		return "", fmt.Errorf("testenv: create sqs queue %s: %w", name, err)
	}
	return out.QueueUrl, nil
}

// DeleteQueue deletes the queue at queueURL with its messages.
func (s *SQS) DeleteQueue(queueURL string) error {
	if err := sqsCall(s.Endpoint(), "DeleteQueue", map[string]any{"QueueUrl": queueURL}, nil); err != nil {
		return fmt.Errorf("testenv: delete sqs queue %s: %w", queueURL, err)
	}
	return nil
}

// SQSMessage is a message ReceiveAll returned.
type SQSMessage struct {
	MessageID string `json:"MessageId"`
	Body      string
	// Attributes are the system attributes, such as MessageGroupId and
	// MessageDeduplicationId.
	Attributes map[string]string
	// MessageAttributes are the message attributes by name.
	MessageAttributes map[string]SQSAttribute
}

// SQSAttribute is a message attribute: DataType String with StringValue,
// or Binary with BinaryValue.
type SQSAttribute struct {
	DataType    string
	StringValue string
	BinaryValue []byte
}

// Attr returns the message attribute name: a String attribute's value, a
// Binary one's bytes, or "" when there is none.
func (m SQSMessage) Attr(name string) string {
	a := m.MessageAttributes[name]
	if a.DataType == "Binary" {
		return string(a.BinaryValue)
	}
	return a.StringValue
}

// Payload returns the payload the relay's SQS sink put in the message,
// decoded as its body_encoding attribute says (see package sink/sqs).
func (m SQSMessage) Payload() ([]byte, error) {
	switch enc := m.Attr("body_encoding"); enc {
	case "":
		return []byte(m.Body), nil
	case "base64":
		return base64.StdEncoding.DecodeString(m.Body)
	case "empty":
		return []byte{}, nil
	default:
		return nil, fmt.Errorf("unknown body_encoding %q", enc)
	}
}

// ReceiveAll receives and deletes every message now visible in the queue at
// queueURL, one ReceiveMessage at a time, so that a FIFO queue's messages
// come in order.
func (s *SQS) ReceiveAll(queueURL string) ([]SQSMessage, error) {
	endpoint := s.Endpoint()
	var out []SQSMessage
	for {
		var res struct{ Messages []json.RawMessage }
		err := sqsCall(endpoint, "ReceiveMessage", map[string]any{
			"QueueUrl": queueURL, "MaxNumberOfMessages": 10, "VisibilityTimeout": 60,
			"AttributeNames": []string{"All"}, "MessageSystemAttributeNames": []string{"All"},
			"MessageAttributeNames": []string{"All"},
		}, &res)
		if err != nil {
			return out, err
		}
		if len(res.Messages) == 0 {
			return out, nil
		}
		var entries []map[string]string
		for i, raw := range res.Messages {
			var m SQSMessage
			var rh struct{ ReceiptHandle string }
			if err := json.Unmarshal(raw, &m); err != nil {
				return out, err
			}
			if err := json.Unmarshal(raw, &rh); err != nil {
				return out, err
			}
			out = append(out, m)
			entries = append(entries, map[string]string{"Id": strconv.Itoa(i), "ReceiptHandle": rh.ReceiptHandle})
		}
		if err := sqsCall(endpoint, "DeleteMessageBatch", map[string]any{"QueueUrl": queueURL, "Entries": entries}, nil); err != nil {
			return out, err
		}
	}
}

// SQSCounts are the numbers of messages a queue holds (GetQueueAttributes'
// approximate counts, exact in the emulator).
type SQSCounts struct {
	// Messages are those that can be received now.
	Messages int
	// NotVisible are those received and not deleted.
	NotVisible int
	// Delayed are those not receivable yet: the emulator makes every
	// message it stores receivable on a later turn of its event loop.
	Delayed int
}

// Empty reports whether the queue holds no message at all.
func (c SQSCounts) Empty() bool { return c == SQSCounts{} }

// Counts returns what the queue at queueURL holds.
func (s *SQS) Counts(queueURL string) (SQSCounts, error) {
	var out struct{ Attributes map[string]string }
	err := sqsCall(s.Endpoint(), "GetQueueAttributes", map[string]any{"QueueUrl": queueURL, "AttributeNames": []string{"All"}}, &out)
	if err != nil {
		return SQSCounts{}, err
	}
	var c SQSCounts
	for name, n := range map[string]*int{"ApproximateNumberOfMessages": &c.Messages,
		"ApproximateNumberOfMessagesNotVisible": &c.NotVisible, "ApproximateNumberOfMessagesDelayed": &c.Delayed} {
		if *n, err = strconv.Atoi(out.Attributes[name]); err != nil {
			return SQSCounts{}, fmt.Errorf("GetQueueAttributes %s: %s %q", queueURL, name, out.Attributes[name])
		}
	}
	// The emulator counts the messages not visible in both.
	c.Messages -= c.NotVisible
	return c, nil
}

// sqsHTTP is the client of the convenience calls. Each call opens a
// connection of its own: the emulator (Node.js) closes a connection idle
// for 5 s, and a call that reused one as it closed failed with
// "connection reset by peer" (a ReceiveMessage cannot be sent again). The
// timeout is generous for a loaded machine.
var sqsHTTP = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

// sqsCall makes one JSON-protocol call and decodes the answer into out.
func sqsCall(endpoint, action string, in any, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, endpoint+"/", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS."+action)
	resp, err := sqsHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", action, resp.Status, b)
	}
	if out == nil || len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	return json.Unmarshal(b, out)
}

// EnsureSQSEmulator returns the package directory of the emulator, first
// installing SQSEmulatorVersion into embedded.CacheDir with npm when it is missing
// or another version. Concurrent test binaries serialise the install with a
// lock file. It fails with the reason, never silently, when Node.js or npm
// are missing or the install fails.
func EnsureSQSEmulator() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", errNoNode
	}
	cache, err := embedded.CacheDir()
	if err != nil {
		return "", err
	}
	module := filepath.Join(cache, "node_modules", SQSEmulatorPackage)
	if installedVersion(module) == SQSEmulatorVersion {
		return module, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("testenv: npm not found on PATH, needed to install the SQS emulator %s@%s into %s: run scripts/deps.sh (or apt-get install npm)",
			SQSEmulatorPackage, SQSEmulatorVersion, cache)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("testenv: sqs emulator cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("testenv: sqs emulator install lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("testenv: sqs emulator install lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if installedVersion(module) == SQSEmulatorVersion {
		return module, nil // another test binary installed it meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pkg := SQSEmulatorPackage + "@" + SQSEmulatorVersion
	cmd := exec.CommandContext(ctx, npm, "install", "--prefix", cache, "--no-audit", "--no-fund", "--loglevel=error", pkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: npm install --prefix %s %s: %w\n%s", cache, pkg, err, out)
	}
	if v := installedVersion(module); v != SQSEmulatorVersion {
		return "", fmt.Errorf("testenv: after npm install, %s holds version %q of %s, want %s", module, v, SQSEmulatorPackage, SQSEmulatorVersion)
	}
	return module, nil
}

// installedVersion returns the version in module's package.json, or "".
func installedVersion(module string) string {
	b, err := os.ReadFile(filepath.Join(module, "package.json"))
	if err != nil {
		return ""
	}
	var pkg struct{ Version string }
	if json.Unmarshal(b, &pkg) != nil {
		return ""
	}
	return pkg.Version
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

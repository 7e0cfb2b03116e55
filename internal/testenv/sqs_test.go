package testenv

import (
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSQSStopStartKeepsQueues(t *testing.T) {
	s, err := StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	endpoint := s.Endpoint()
	url, err := s.CreateQueue("kept.fifo", map[string]string{"FifoQueue": "true", "MaximumMessageSize": "2048"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, endpoint+"/") {
		t.Errorf("queue URL %s is not under the endpoint %s", url, endpoint)
	}
	send := map[string]any{"QueueUrl": url, "MessageBody": "m", "MessageGroupId": "g", "MessageDeduplicationId": "d"}
	if err := sqsCall(endpoint, "SendMessage", send, nil); err != nil {
		t.Fatal(err)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.Port()), time.Second); err == nil {
		c.Close()
		t.Fatal("emulator still accepts connections after Stop")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.Endpoint() != endpoint {
		t.Errorf("endpoint changed from %s to %s", endpoint, s.Endpoint())
	}
	var attrs struct{ Attributes map[string]string }
	err = sqsCall(endpoint, "GetQueueAttributes", map[string]any{"QueueUrl": url, "AttributeNames": []string{"All"}}, &attrs)
	if err != nil {
		t.Fatalf("queue after restart: %v", err)
	}
	if attrs.Attributes["FifoQueue"] != "true" || attrs.Attributes["MaximumMessageSize"] != "2048" {
		t.Errorf("attributes after restart: %v", attrs.Attributes)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
}

func TestSQSReceiveAll(t *testing.T) {
	s, err := StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	url, err := s.CreateQueue("r.fifo", map[string]string{"FifoQueue": "true"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		send := map[string]any{"QueueUrl": url, "MessageBody": "aGk=", "MessageGroupId": "g", "MessageDeduplicationId": strconv.Itoa(i),
			"MessageAttributes": map[string]any{
				"n":             map[string]string{"DataType": "String", "StringValue": strconv.Itoa(i)},
				"b":             map[string]string{"DataType": "Binary", "BinaryValue": "AQI="},
				"body_encoding": map[string]string{"DataType": "String", "StringValue": "base64"},
			}}
		if err := sqsCall(s.Endpoint(), "SendMessage", send, nil); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := s.Counts(url); err != nil || c.Messages+c.Delayed != 15 || c.NotVisible != 0 {
		t.Fatalf("counts %+v, %v; want 15 messages (some may be delayed)", c, err)
	}
	msgs, err := s.ReceiveAll(url)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Counts(url); err != nil || !c.Empty() {
		t.Errorf("counts after ReceiveAll %+v, %v; want empty", c, err)
	}
	if len(msgs) != 15 {
		t.Fatalf("received %d messages, want 15", len(msgs))
	}
	for i, m := range msgs {
		p, err := m.Payload()
		if m.Attr("n") != strconv.Itoa(i) || m.Attr("b") != "\x01\x02" || string(p) != "hi" || err != nil ||
			m.Attributes["MessageGroupId"] != "g" || m.Attributes["MessageDeduplicationId"] != strconv.Itoa(i) {
			t.Errorf("message %d: %+v, payload %q, %v", i, m, p, err)
		}
	}
	if again, err := s.ReceiveAll(url); err != nil || len(again) != 0 {
		t.Errorf("second ReceiveAll: %d messages, %v; want none (deleted)", len(again), err)
	}
}

func TestSQSShutdownKillsProcessGroup(t *testing.T) {
	s, err := StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	s.Shutdown()
	s.Shutdown()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("emulator process %d still running after Shutdown", pid)
	}
	if err := s.Start(); err == nil {
		t.Error("Start after Shutdown succeeded")
	}
}

// TestSQSExitsWithTestProcess checks the watchdog: the emulator exits when
// its stdin closes, as it does when the test process dies.
func TestSQSExitsWithTestProcess(t *testing.T) {
	s, err := StartSQS()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	s.mu.Lock()
	s.stdin.Close()
	exited := s.exited
	s.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("emulator still running 10s after its stdin closed")
	}
}

func TestSQSWithoutNodeFails(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := exec.LookPath("node"); err == nil {
		t.Skip("node still found")
	}
	_, err := StartSQS()
	if err == nil || !strings.Contains(err.Error(), "deps.sh") {
		t.Fatalf("StartSQS without node: %v, want an error pointing to scripts/deps.sh", err)
	}
}

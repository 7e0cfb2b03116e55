package embedded

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSRestartKeepsStreams(t *testing.T) {
	n, err := StartNATS(NATSOptions{MaxPayload: 64 * 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	url := n.URL()

	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != 64*1024 {
		t.Errorf("max payload %d, want %d", got, 64*1024)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	n.Stop()
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if n.URL() != url {
		t.Errorf("URL changed from %s to %s", url, n.URL())
	}

	// The client may not have noticed the restart yet, and a request sent
	// on the old connection gets no reply: retry with short timeouts.
	var msg *jetstream.RawStreamMsg
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		str, err := js.Stream(actx, "S")
		if err == nil {
			msg, err = str.GetMsg(actx, 1)
		}
		acancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("message after restart: %v", err)
		}
	}
	if string(msg.Data) != "kept" {
		t.Fatalf("message after restart: %q, want \"kept\"", msg.Data)
	}
}

func TestNATSShutdownRemovesStore(t *testing.T) {
	n, err := StartNATS(NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := n.opts.StoreDir
	n.Shutdown()
	n.Shutdown()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("store dir %s still there after Shutdown (%v)", dir, err)
	}
	if err := n.Start(); err == nil {
		t.Error("Start after Shutdown succeeded")
	}
}

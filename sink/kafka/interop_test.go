package kafka

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/event"
)

// TestKcatReadsWhatTheRelayWrote publishes events to an in-process kfake
// broker and reads them back with Debian's kcat (librdkafka), a client that
// shares no code with franz-go: key, headers and payload must arrive as the
// contract says, snappy-compressed batches included, and each aggregate's
// events in order.
func TestKcatReadsWhatTheRelayWrote(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is not installed: run scripts/deps.sh, which installs Debian's kcat package")
	}
	c := newCluster(t, kfake.SeedTopics(3, "interop.order"))
	var compressed atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				var b kmsg.RecordBatch
				if b.ReadFrom(p.Records) == nil && b.Attributes&0x07 == 2 {
					compressed.Store(true)
				}
			}
		}
		return nil, nil, false
	})
	s := newSink(t, c.ListenAddrs(), "interop.{aggregate_type}", Options{})

	var batches [][]*event.Event
	for round := range 3 {
		var batch []*event.Event
		for a := range 4 {
			n := round*4 + a
			e := testEvent(n, "order", fmt.Sprintf("order-%d", a))
			e.EventType = fmt.Sprintf("step-%d", round)
			e.Payload = fmt.Appendf(nil, `{"order":%d,"step":%d,"note":"größe ✓"}`, a, round)
			if a == 1 {
				e.Headers = map[string]string{"trace_id": fmt.Sprintf("trace-%d", n), "tenant": "acme"}
			}
			if a == 2 && round == 1 { // compressible enough to be sent snappy-compressed
				e.Payload = fmt.Appendf(nil, `{"order":%d,"step":%d,"pad":"%s"}`, a, round, strings.Repeat("abcd", 2048))
			}
			batch = append(batch, e)
		}
		batches = append(batches, batch)
	}
	for _, b := range batches { // one round after the other, as the pipeline would
		if err := s.Publish(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-b", c.ListenAddrs()[0], "-C", "-t", "interop.order",
		"-o", "beginning", "-e", "-q", "-f", `%p|%o|%k|%h|%s\n`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v (%s)", cmd, err, exitStderr(err))
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	for i, l := range lines {
		if i < 6 {
			t.Logf("kcat: %.200s", l)
		}
	}

	byID := map[string]*event.Event{}
	for _, b := range batches {
		for _, e := range b {
			byID[e.ID] = e
		}
	}
	type pos struct {
		partition string
		offset    int
	}
	last := map[string]pos{}  // key -> position of its previous record
	step := map[string]int{}  // key -> next expected round
	seen := map[string]bool{} // message_id
	for _, l := range lines {
		f := strings.SplitN(l, "|", 5)
		if len(f) != 5 {
			t.Fatalf("unexpected kcat line %q", l)
		}
		partition, key, headers, payload := f[0], f[2], f[3], f[4]
		offset, _ := strconv.Atoi(f[1])
		id := headerValue(headers, "message_id")
		e := byID[id]
		if e == nil || seen[id] {
			t.Fatalf("kcat read an unknown or repeated message_id %q: %q", id, l)
		}
		seen[id] = true
		if key != e.AggregateID {
			t.Errorf("%s: key %q, want %q", id, key, e.AggregateID)
		}
		if payload != string(e.Payload) {
			t.Errorf("%s: payload %.80q, want %.80q", id, payload, e.Payload)
		}
		want := ""
		if e.Headers != nil {
			want = fmt.Sprintf("tenant=acme,trace_id=%s,", e.Headers["trace_id"])
		}
		want += fmt.Sprintf("message_id=%s,event_type=%s,aggregate_type=order,aggregate_id=%s,content-type=application/json", e.ID, e.EventType, e.AggregateID)
		if headers != want {
			t.Errorf("%s: headers %q, want %q", id, headers, want)
		}
		if p, ok := last[key]; ok && (p.partition != partition || p.offset >= offset) {
			t.Errorf("key %s: record at %s/%d after one at %s/%d", key, partition, offset, p.partition, p.offset)
		}
		last[key] = pos{partition, offset}
		if got := e.EventType; got != fmt.Sprintf("step-%d", step[key]) {
			t.Errorf("key %s: %s read when step-%d was due", key, got, step[key])
		}
		step[key]++
	}
	if !compressed.Load() {
		t.Error("no batch was snappy-compressed; the test no longer covers compression")
	}
	if len(seen) != len(byID) {
		t.Errorf("kcat read %d of %d events", len(seen), len(byID))
	}
}

// headerValue returns the value of name in kcat's %h output, "k=v,k=v".
func headerValue(headers, name string) string {
	for _, kv := range strings.Split(headers, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

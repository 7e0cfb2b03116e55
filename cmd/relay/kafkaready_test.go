package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/sink/kafka/kafkatest"
)

// kafkaReadyBound is how soon after its broker stops a Kafka relay must
// answer /readyz 503: the pipeline's stall bound (5 s) and room for a
// loaded machine.
const kafkaReadyBound = 15 * time.Second

// TestKafkaBrokerStopNotReady makes the Kafka broker acknowledge nothing
// while producers write, in both capture modes: first it holds every
// produce request unanswered (connections and metadata still work), then
// it stops, then it stops again with an idle outbox. The relay answers
// /readyz 503 within kafkaReadyBound each time, and 200 again once the
// broker is back.
func TestKafkaBrokerStopNotReady(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll", "wal"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c, sinkYAML, collect := startKafkaCluster(t)
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			s := newStack(t, stackOptions{Mode: mode, Sink: sinkYAML, Collect: collect, Extra: "http:\n  listen: " + addr + "\n"})
			s.wireGaps = true
			relay := s.start()
			waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			produced := make(chan struct{})
			go func() { s.produce(ctx, 3000, 300, 4); close(produced) }()
			s.waitPublishing()
			for _, phase := range []string{"stalled under load", "stopped under load", "stopped idle"} {
				if phase == "stopped idle" {
					<-produced
					s.waitDrained(90 * time.Second)
				}
				resume := outage(t, c, phase)
				stopped := time.Now()
				for readyz(addr) != http.StatusServiceUnavailable {
					if time.Since(stopped) > kafkaReadyBound {
						t.Fatalf("%s: /readyz still %d %s after the Kafka broker stopped acknowledging", phase, readyz(addr), kafkaReadyBound)
					}
					time.Sleep(100 * time.Millisecond)
				}
				t.Logf("%s: /readyz 503 %.1fs after the Kafka broker stopped acknowledging", phase, time.Since(stopped).Seconds())
				resume()
				waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
			}
			s.waitDrained(90 * time.Second)
			if code := relay.stop(t, 15*time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
		})
	}
}

// TestFreshWalRelayResendsNothing writes 200 events before a fresh wal
// relay first starts, lets it publish them once each and reads /metrics:
// no counter says any was published again. relay_events_resent_total
// counted every replayed event whose row was unarchived, 200 here, though
// no earlier run had published one; it is gone.
func TestFreshWalRelayResendsNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Mode: "wal"})
	addr := s.withHTTP()
	s.writeSome(200)
	relay := s.start()
	s.waitDrained(90 * time.Second)
	metrics := get(addr, "/metrics")
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "relay_events_resent_total") && !strings.HasSuffix(line, " 0") {
			t.Errorf("a fresh wal relay that published 200 events once each reports %q", line)
		}
	}
	if !strings.Contains(metrics, "relay_events_replay_skipped_total 0") {
		t.Errorf("/metrics lacks relay_events_replay_skipped_total 0")
	}
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.verify()
}

// outage starts phase's Kafka outage on c ("stalled ...": produce requests
// are held unanswered; otherwise the broker stops) and returns the function
// that ends it.
func outage(t *testing.T, c *kafkatest.Cluster, phase string) func() {
	if !strings.HasPrefix(phase, "stalled") {
		c.Stop()
		return func() {
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	k := c.Kfake()
	release := make(chan struct{})
	k.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-release:
			return nil, nil, false // answered as usual; the control is dropped
		default:
		}
		k.KeepControl()
		k.SleepControl(func() { <-release })
		return nil, nil, false
	})
	return func() { close(release) }
}

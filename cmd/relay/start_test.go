package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestStartDuringOutage starts `relay run` while its database or its
// broker is down: the relay keeps running, not ready (/readyz 503 saying
// what it waits for, relay_capture_ready or relay_sink_ready 0; with the
// database down, relay status shows it waiting, from its /status),
// retries, and delivers everything once the server is back.
func TestStartDuringOutage(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg, _, s := proxiedStack(t)
		addr := s.withHTTP()
		s.writeSome(200)
		if err := pg.StopServer(context.Background()); err != nil {
			t.Fatal(err)
		}
		relay := s.start()
		waitStartRetries(t, relay, addr, "relay_capture_ready 0")
		st, code, out := relayStatus(t, s.cfgPath)
		if code != 1 || st.Database.Reachable || len(st.Relays) != 1 || st.Relays[0].Live == nil ||
			!strings.Contains(st.Relays[0].Live.Starting, "not started yet, retrying") || st.Relays[0].Live.PID != relay.cmd.Process.Pid {
			t.Errorf("relay status while the relay waits for Postgres: exit %d\n%s", code, out)
		}
		if err := pg.StartServer(context.Background()); err != nil {
			t.Fatal(err)
		}
		s.finish(relay, addr)
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		s := newStack(t)
		s.wireGaps = true
		addr := s.withHTTP()
		s.writeSome(200)
		s.nats.Stop()
		relay := s.start()
		waitStartRetries(t, relay, addr, "relay_sink_ready 0")
		if err := s.nats.Start(); err != nil {
			t.Fatal(err)
		}
		s.finish(relay, addr)
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		c, sinkYAML, collect := startKafkaCluster(t)
		s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect})
		addr := s.withHTTP()
		s.writeSome(200)
		c.Stop()
		relay := s.start()
		waitStartRetries(t, relay, addr, "relay_sink_ready 0")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		s.finish(relay, addr)
	})
}

// TestStartRefusedCredentials checks that refused credentials still end
// `relay run` at once with status 1, naming the server without the secret.
func TestStartRefusedCredentials(t *testing.T) {
	n, err := testenv.StartNATS(testenv.NATSOptions{Configure: func(o *server.Options) { o.Authorization = "right-t0ken" }})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	dsn := testenv.NewDB(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("nobody", "wr0ng-pw")
	badPG := u.String()
	for _, tc := range []struct{ name, pg, nats, want string }{
		{"postgres role", badPG, strings.Replace(n.URL(), "://", "://right-t0ken@", 1), "sqlstate 28000"},
		{"nats token", dsn, strings.Replace(n.URL(), "://", "://wr0ng-t0ken@", 1), "authorization violation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeConfig(t, fmt.Sprintf("postgres:\n  url: %s\ncapture:\n  mode: poll\nsink:\n  type: nats\n  nats:\n    url: %s\n", tc.pg, tc.nats))
			out, code := runRelay(t, "run", "--config", cfg)
			if code != 1 || !strings.Contains(strings.ToLower(out), tc.want) || strings.Contains(out, "wr0ng") {
				t.Errorf("exit %d, want 1 with %q:\n%s", code, tc.want, out)
			}
		})
	}
}

// withHTTP adds http.listen on a free port to the stack's config and
// returns the address.
func (s *stack) withHTTP() string {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	appendConfig(s.t, s.cfgPath, "http:\n  listen: "+addr+"\nretry:\n  initial: 50ms\n  max: 1s\n")
	return addr
}

// appendConfig appends yaml to the config file at path.
func appendConfig(t *testing.T, path, yaml string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, yaml...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeSome writes n events over 20 aggregates.
func (s *stack) writeSome(n int) {
	for i := range n {
		if _, err := s.write(context.Background(), i%20, 1); err != nil {
			s.t.Fatal(err)
		}
	}
}

// waitStartRetries waits until the relay, started during an outage, has
// tried to start several times while answering /readyz 503 and /metrics with
// want, and checks it is still running.
func waitStartRetries(t *testing.T, relay *relayProc, addr, want string) {
	t.Helper()
	waitFor(t, func() bool {
		m := get(addr, "/metrics")
		return strings.Contains(m, want) && !strings.Contains(m, "relay_start_attempts_total 0") &&
			!strings.Contains(m, "relay_start_attempts_total 1\n") && !strings.Contains(m, "relay_start_attempts_total 2\n")
	})
	if code := readyz(addr); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d while waiting to start", code)
	}
	if body := get(addr, "/readyz"); !strings.Contains(body, "not started yet") {
		t.Errorf("/readyz says %q", body)
	}
	select {
	case <-relay.done:
		t.Fatalf("relay exited while waiting to start: %v", relay.err)
	default:
	}
}

// finish waits until the relay is ready and has published everything,
// stops it and verifies the deliveries.
func (s *stack) finish(relay *relayProc, addr string) {
	s.t.Helper()
	waitFor(s.t, func() bool { return readyz(addr) == http.StatusOK })
	s.waitDrained(60 * time.Second)
	if code := relay.stop(s.t, 15*time.Second); code != 0 {
		s.t.Fatalf("exit %d", code)
	}
	s.verify()
}

// get returns the body of addr's path, or "" when it does not answer.
func get(addr, path string) string {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestKafkaOutageNotReady makes the Kafka broker answer every produce
// request NOT_ENOUGH_REPLICAS for 10 seconds while events flow, an outage
// the Kafka client retries within its 15s timeout: /readyz answers 503
// during it, as it does for every sink (a publish waiting over 5s for the
// broker counts as unreachable); then everything is delivered.
func TestKafkaOutageNotReady(t *testing.T) {
	c, sinkYAML, collect := startKafkaCluster(t)
	s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect})
	addr := s.withHTTP()
	relay := s.start()
	waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
	s.writeSome(50)
	s.waitDrained(60 * time.Second)
	fault := c.Kfake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
	stopped := time.Now()
	s.writeSome(50)
	var notReady time.Duration
	for time.Since(stopped) < 10*time.Second {
		if notReady == 0 && readyz(addr) == http.StatusServiceUnavailable {
			notReady = time.Since(stopped)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fault.Remove()
	if notReady == 0 {
		t.Errorf("/readyz stayed 200 through a 10s Kafka outage")
	}
	s.finish(relay, addr)
	t.Logf("kafka outage: /readyz 503 after %s", notReady.Round(100*time.Millisecond))
}

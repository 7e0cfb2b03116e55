package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink/sinktest"
)

// testEvent returns an event of aggregate type typ with a payload of n
// bytes.
func testEvent(typ string, n int) *event.Event {
	return &event.Event{ID: fmt.Sprintf("00000000-0000-0000-0000-%012d", n), AggregateType: typ, AggregateID: "a1",
		EventType: "created", Payload: []byte(strings.Repeat("x", n))}
}

// admin runs a command on srv as the default user, failing the test on an
// error.
func admin(t *testing.T, srv *testenv.Redis, args ...any) {
	t.Helper()
	c := newClient(t, srv.URL())
	defer c.Close()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// publishClasses publishes batch with a sink of cfg and returns the
// classes of its events (sinktest.Classes) and the error.
func publishClasses(t *testing.T, cfg Config, batch []*event.Event) ([]string, error) {
	t.Helper()
	s := newTestSink(t, cfg, Options{Timeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := s.Publish(ctx, batch)
	return sinktest.Classes(err, len(batch)), err
}

// TestErrorClasses produces each failure the sink maps against a real
// redis-server and checks its class: the destination's (unavailable) for
// the server, credentials, ACL, memory and key type; the event's
// (permanent) for a field over proto-max-bulk-len.
func TestErrorClasses(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin(t, srv, "ACL", "SETUSER", "noxadd", "on", ">pw", "~*", "+@all", "-xadd")
	admin(t, srv, "ACL", "SETUSER", "keyed", "on", ">pw", "~allowed.*", "+@all")
	admin(t, srv, "SET", "str.order", "a string")
	url := func(userinfo string) string { return "redis://" + userinfo + "@" + srv.Addr() + "/0" }
	one := []*event.Event{testEvent("order", 10)}

	for _, tc := range []struct {
		name, url, stream, want string
	}{
		{"NOPERM command", url("noxadd:pw"), "s.{aggregate_type}", "NOPERM"},
		{"NOPERM key", url("keyed:pw"), "denied.{aggregate_type}", "NOPERM"},
		{"WRONGPASS", url("keyed:wrong"), "allowed.{aggregate_type}", "WRONGPASS"},
		{"WRONGTYPE", srv.URL(), "str.{aggregate_type}", "WRONGTYPE"},
		{"refused", "redis://127.0.0.1:1/0", "s.{aggregate_type}", "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := publishClasses(t, Config{URL: tc.url, Stream: tc.stream}, one)
			if !slices.Equal(got, []string{"unavailable"}) || !strings.Contains(fmt.Sprint(err), tc.want) {
				t.Fatalf("classes %v, error %v; want unavailable with %s", got, err, tc.want)
			}
			if strings.Contains(fmt.Sprint(err), ":pw@") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}

	// A key of another type breaks its stream only: the other stream of
	// the batch is written.
	t.Run("WRONGTYPE beside a stream", func(t *testing.T) {
		got, _ := publishClasses(t, Config{URL: srv.URL(), Stream: "str.{aggregate_type}"},
			[]*event.Event{testEvent("order", 1), testEvent("invoice", 2)})
		if !slices.Equal(got, []string{"unavailable", "ok"}) {
			t.Fatalf("classes %v, want [unavailable ok]", got)
		}
	})
}

// TestServerStates puts a server in the states that refuse every write
// and checks that the sink reports them as the destination's fault: out of
// memory, a read-only replica, a busy script, XADD renamed away.
func TestServerStates(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"--busy-reply-threshold", "100"}})
	cfg := Config{URL: srv.URL(), Stream: "st.{aggregate_type}"}
	one := []*event.Event{testEvent("order", 10)}
	check := func(t *testing.T, want string) {
		t.Helper()
		got, err := publishClasses(t, cfg, one)
		if !slices.Equal(got, []string{"unavailable"}) || !strings.Contains(fmt.Sprint(err), want) {
			t.Fatalf("classes %v, error %v; want unavailable with %s", got, err, want)
		}
	}
	t.Run("OOM", func(t *testing.T) {
		admin(t, srv, "CONFIG", "SET", "maxmemory", "1")
		defer admin(t, srv, "CONFIG", "SET", "maxmemory", "0")
		check(t, "OOM")
	})
	t.Run("READONLY", func(t *testing.T) {
		admin(t, srv, "REPLICAOF", "127.0.0.1", "1")
		defer admin(t, srv, "REPLICAOF", "NO", "ONE")
		check(t, "READONLY")
	})
	t.Run("BUSY", func(t *testing.T) {
		c := newClient(t, srv.URL())
		defer c.Close()
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { c.Eval(context.Background(), "while true do end", nil) })
		ctl := newClient(t, srv.URL())
		defer ctl.Close()
		for !goredis.HasErrorPrefix(ctl.Ping(context.Background()).Err(), "BUSY") {
			time.Sleep(20 * time.Millisecond)
		}
		defer ctl.ScriptKill(context.Background())
		check(t, "BUSY")
	})
	t.Run("unknown command", func(t *testing.T) {
		renamed := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"--rename-command", "XADD", ""}})
		got, err := publishClasses(t, Config{URL: renamed.URL(), Stream: "st"}, one)
		if !slices.Equal(got, []string{"unavailable"}) {
			t.Fatalf("classes %v, error %v; want unavailable", got, err)
		}
	})
}

// TestOversize checks that a field over the server's proto-max-bulk-len is
// the event's fault: refused before sending when the sink knows the limit,
// and when the limit was lowered after the sink read it, by the server's
// protocol error, the events after it in the pipeline failing as the
// destination's fault (Redis closes the connection) and going through on
// the next publish.
func TestOversize(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	s := newTestSink(t, Config{URL: srv.URL(), Stream: "big.{aggregate_type}"}, Options{})
	ctx := context.Background()
	if err := s.Publish(ctx, []*event.Event{testEvent("a", 1)}); err != nil {
		t.Fatal(err)
	}
	if got := s.maxBulk.Load(); got != defaultMaxBulk {
		t.Fatalf("limit read %d, want the default %d", got, defaultMaxBulk)
	}
	admin(t, srv, "CONFIG", "SET", "proto-max-bulk-len", "1mb")
	batch := []*event.Event{testEvent("a", 2), testEvent("b", 2<<20), testEvent("c", 3)}
	// Redis replies with a protocol error and closes the connection, or
	// closes it while the field is still being written.
	got := sinktest.Classes(s.Publish(ctx, batch), len(batch))
	if got[0] == "transient" || (got[1] != "permanent" && got[1] != "unavailable") || got[2] != "unavailable" {
		t.Fatalf("stale limit: classes %v, want [ok or unavailable, permanent or unavailable, unavailable]", got)
	}
	batch = []*event.Event{testEvent("b", 2<<20), testEvent("c", 3)}
	got = sinktest.Classes(s.Publish(ctx, batch), len(batch))
	if !slices.Equal(got, []string{"permanent", "ok"}) {
		t.Fatalf("after the limit was read again: classes %v, want [permanent ok]", got)
	}
}

// TestClassifyReplies checks the classes of error replies that a single
// server cannot easily produce (a cluster or a failover in progress, a
// loading server) and of an unknown one.
func TestClassifyReplies(t *testing.T) {
	s := &Sink{}
	for reply, want := range map[string]fault.Class{
		"LOADING Redis is loading the dataset in memory":                                   fault.Unavailable,
		"CLUSTERDOWN The cluster is down":                                                  fault.Unavailable,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": fault.Unavailable,
		"NOAUTH Authentication required.":                                                  fault.Unavailable,
		"TRYAGAIN Multiple keys request during rehashing of slot":                          fault.Unavailable,
		"MISCONF Redis is configured to save RDB snapshots":                                fault.Unavailable,
		"ERR max number of clients reached":                                                fault.Unavailable,
		"ERR Protocol error: invalid bulk length":                                          fault.Permanent,
		"ERR something new":                                                                fault.Transient,
	} {
		err := s.classify(context.Background(), replyError(reply))
		if got := fault.ClassOf(err); got != want {
			t.Errorf("%s: %s, want %s", reply, got, want)
		}
	}
	if err := s.classify(context.Background(), errors.New("dial tcp: i/o timeout")); fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("network error: %s, want unavailable", fault.ClassOf(err))
	}
}

// replyError is an error reply as go-redis returns it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

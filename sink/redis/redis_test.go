package redis

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
)

// TestTLSAndACL publishes over TLS (rediss://, the CA from sink.TLS) as an
// ACL user whose password is given apart from the URL, and checks that the
// sink's description does not show it.
func TestTLSAndACL(t *testing.T) {
	t.Parallel()
	cert, key, _ := testenv.WriteCert(t)
	srv := testenv.StartRedis(t, testenv.RedisOptions{TLSCert: cert, TLSKey: key})
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), TLSConfig: tlsFor(t, cert)})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "relay", "on", ">s3cret", "~tls.*", "+xadd", "+ping", "+config|get").Err(); err != nil {
		t.Fatal(err)
	}
	s := newTestSink(t, Config{URL: "rediss://relay@" + srv.Addr() + "/0", Password: "s3cret", Stream: "tls.{aggregate_type}",
		TLS: sink.TLS{Enabled: true, CAFile: cert}}, Options{})
	if err := s.Publish(ctx, []*event.Event{testEvent("order", 5)}); err != nil {
		t.Fatal(err)
	}
	if n := admin.XLen(ctx, "tls.order").Val(); n != 1 {
		t.Fatalf("tls.order holds %d entries, want 1", n)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	if d := s.Destination(); strings.Contains(d, "s3cret") || !strings.HasPrefix(d, "redis rediss://") {
		t.Fatalf("destination %q", d)
	}
	// Without the CA the server's certificate is refused: the
	// destination's fault.
	plain := newTestSink(t, Config{URL: "rediss://" + srv.Addr() + "/0", Stream: "tls.{aggregate_type}"}, Options{})
	if err := plain.Probe(ctx, sink.Broker); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("probe without the CA: %v", err)
	}
}

// TestCheck checks relay check's answers: a user that may not XADD (ACL
// DRYRUN says so), a key of another type under a fixed stream name, and a
// user allowed XADD but not ACL DRYRUN, which passes.
func TestCheck(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin(t, srv, "ACL", "SETUSER", "noxadd", "on", ">pw", "~*", "+@all", "-xadd")
	admin(t, srv, "ACL", "SETUSER", "narrow", "on", ">pw", "~out.*", "+xadd", "+ping")
	admin(t, srv, "SET", "out.string", "x")
	ctx := context.Background()
	for _, tc := range []struct {
		name, user, stream, want string
	}{
		{"no XADD", "noxadd", "out.{aggregate_type}", "may not XADD"},
		{"wrong type", "narrow", "out.string", ""}, // narrow may not TYPE: passes
		{"wrong type default", "", "out.string", "holds a string, not a stream"},
		{"narrow user", "narrow", "out.{aggregate_type}", ""},
		{"wrong password", "narrow:bad", "out.{aggregate_type}", "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := "redis://" + srv.Addr() + "/0"
			if tc.user != "" {
				user, pw, found := strings.Cut(tc.user, ":")
				if !found {
					pw = "pw"
				}
				u = "redis://" + user + ":" + pw + "@" + srv.Addr() + "/0"
			}
			err := newTestSink(t, Config{URL: u, Stream: tc.stream}, Options{}).Check(ctx)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("check: %v, want %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), ":pw@") {
				t.Fatalf("check shows the password: %v", err)
			}
		})
	}
}

// TestProbe checks Probe: PING for the broker, TYPE for a stream, and no
// probe for a stream the user may not TYPE.
func TestProbe(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin(t, srv, "ACL", "SETUSER", "narrow", "on", ">pw", "~p.*", "+xadd", "+ping")
	admin(t, srv, "SET", "p.string", "x")
	ctx := context.Background()
	s := newTestSink(t, Config{URL: srv.URL(), Stream: "p.{aggregate_type}"}, Options{})
	if err := s.Probe(ctx, sink.Broker); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(ctx, "p.none"); err != nil {
		t.Fatal(err)
	}
	if err := s.Probe(ctx, "p.string"); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("probe of a string key: %v", err)
	}
	narrow := newTestSink(t, Config{URL: "redis://narrow:pw@" + srv.Addr() + "/0", Stream: "p.{aggregate_type}"}, Options{})
	if err := narrow.Probe(ctx, "p.none"); err != sink.ErrNoProbe {
		t.Fatalf("probe without TYPE: %v, want ErrNoProbe", err)
	}
	if !strings.HasPrefix(s.DestinationOf(testEvent("or der", 1)), "p.or_der_") || !s.RowChosen() {
		t.Fatalf("destination %q", s.DestinationOf(testEvent("or der", 1)))
	}
}

// TestEntryLayout checks the fields of an entry: the contract fields, the
// forwarded row headers in name order, payload last; row headers named
// like a field the relay sets, in any case, are dropped and counted; and
// MAXLEN ~ trims the stream.
func TestEntryLayout(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	drops := sink.NewHeaderDrops(slog.New(slog.DiscardHandler))
	s := newTestSink(t, Config{URL: srv.URL(), Stream: "lay.{aggregate_type}", MaxLen: 10}, Options{HeaderDrops: drops})
	e := testEvent("order", 3)
	e.ContentType = event.ContentTypeJSON
	e.Headers = map[string]string{"zeta": "z", "alpha": "a", "Payload": "shadow", "MESSAGE_ID": "forged"}
	ctx := context.Background()
	if err := s.Publish(ctx, []*event.Event{e}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv.URL())
	defer c.Close()
	entries, err := rangeRaw(ctx, c, "lay.order")
	if err != nil || len(entries) != 1 {
		t.Fatalf("entries %v, %v", entries, err)
	}
	want := []string{"message_id", e.ID, "event_type", "created", "aggregate_type", "order", "aggregate_id", "a1",
		"content_type", event.ContentTypeJSON, "alpha", "a", "zeta", "z", "payload", "xxx"}
	if !slices.Equal(entries[0], want) {
		t.Fatalf("fields %q\nwant   %q", entries[0], want)
	}
	if n := drops.Count(sink.DropReserved) + drops.Count(sink.DropControl); n != 2 {
		t.Fatalf("%d row headers dropped, want 2", n)
	}
	batch := make([]*event.Event, 0, 500)
	for i := range 500 {
		batch = append(batch, testEvent("order", i))
	}
	for range 4 {
		if err := s.Publish(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.XLen(ctx, "lay.order").Val(); n >= 1000 {
		t.Fatalf("lay.order holds %d entries after 2001 XADDs with MAXLEN ~ 10", n)
	}
}

// TestSentinelAndClusterOptions checks the client each topology gets,
// without servers: the Sentinel master and addresses, the cluster seeds.
func TestSentinelAndClusterOptions(t *testing.T) {
	uo, err := universalOptions(Config{URL: "redis://u:p@ignored:6379/2", Sentinel: Sentinel{Master: "m", Addrs: []string{"s1:26379"}, Password: "sp"}},
		Options{}.withDefaults())
	if err != nil || uo.MasterName != "m" || !slices.Equal(uo.Addrs, []string{"s1:26379"}) || uo.DB != 2 || uo.SentinelPassword != "sp" || uo.Password != "p" {
		t.Fatalf("sentinel: %+v, %v", uo, err)
	}
	uo, err = universalOptions(Config{URL: "rediss://n1:6379", ClusterAddrs: []string{"n2:6379"}}, Options{Timeout: time.Second})
	if err != nil || !uo.IsClusterMode || !slices.Equal(uo.Addrs, []string{"n1:6379", "n2:6379"}) || uo.TLSConfig == nil || uo.MaxRetries != -1 {
		t.Fatalf("cluster: %+v, %v", uo, err)
	}
	if _, err := universalOptions(Config{URL: "redis://n1:6379/3", ClusterAddrs: []string{"n2:6379"}}, Options{}); err == nil {
		t.Fatal("cluster with database 3 accepted")
	}
	if _, err := New(Config{URL: "redis://:s3cret@h:1/x", Stream: "s"}, Options{}); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("bad URL: %v", err)
	}
}

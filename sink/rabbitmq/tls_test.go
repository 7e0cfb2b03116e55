package rabbitmq

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
)

// TestTLS publishes to the node's TLS listener: with sink.rabbitmq.tls's CA
// file, over an amqps:// URL and over an amqp:// one (which TLS turns into
// amqps on the URL's port), the event is confirmed and arrives. With
// another CA, or the system's roots, the connection fails as the
// destination's fault (unavailable: held, not dead-lettered), for Publish
// and Probe alike, and neither the errors nor the log hold the password.
func TestTLS(t *testing.T) {
	t.Parallel()
	node := broker(t)
	ad := newAdmin(t)
	ad.exchangeWithQueue("tls")
	ca := sink.TLS{Enabled: true, CAFile: node.CAFile()}

	for _, scheme := range []string{"amqps", "amqp"} {
		s := newTestSink(t, scheme+"://guest:guest@"+node.TLSAddr()+"/", Config{Exchange: "tls", RoutingKey: "k", TLS: ca}, Options{})
		want(t, publish(t, s, newEvent("tls-"+scheme, "a", 10)), "ok")
	}
	var ids []string
	for _, d := range ad.drain("tls") {
		ids = append(ids, d.MessageId)
	}
	if strings.Join(ids, ",") != "tls-amqps,tls-amqp" {
		t.Errorf("queue tls holds %v, want tls-amqps and tls-amqp", ids)
	}

	otherCA, _, _ := testenv.WriteCert(t)
	const secret = "tls-secret-pw"
	url := "amqps://guest:" + secret + "@" + node.TLSAddr() + "/"
	for name, tc := range map[string]sink.TLS{
		"wrong_ca":     {Enabled: true, CAFile: otherCA},
		"system_roots": {},
	} {
		t.Run(name, func(t *testing.T) {
			var log testenv.SyncBuffer
			s := newTestSink(t, url, Config{Exchange: "tls", RoutingKey: "k", TLS: tc},
				Options{Logger: slog.New(slog.NewTextHandler(&log, nil)), DialTimeout: 10 * time.Second})
			err := s.Publish(ctxFor(t, 30*time.Second), []*event.Event{newEvent("tls-bad", "a", 10)})
			perr := sink.Failed(err, 0)
			if fault.ClassOf(perr) != fault.Unavailable || !strings.Contains(perr.Error(), "certificate") {
				t.Errorf("publish: %v, want an unavailable certificate error", perr)
			}
			probe := s.Probe(ctxFor(t, 30*time.Second), sink.Broker)
			if fault.ClassOf(probe) != fault.Unavailable {
				t.Errorf("Probe: %v, want unavailable", probe)
			}
			for what, text := range map[string]string{"publish error": perr.Error(), "probe error": probe.Error(), "log": log.String(), "destination": s.Destination()} {
				if strings.Contains(text, secret) {
					t.Errorf("the %s holds the password: %s", what, text)
				}
			}
		})
	}
}

package kafka

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/sink"
	"github.com/outboxrelay/relay/sink/sinktest"
)

func TestSASL(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			c := newCluster(t, kfake.EnableSASL(), kfake.Superuser(mech, "relay", "s3cret"), kfake.SeedTopics(1, "t"))
			var logs bytes.Buffer
			cfg := Config{Brokers: c.ListenAddrs(), Topic: "t", SASL: SASL{Mechanism: mech, Username: "relay", Password: "s3cret"}}
			s := newSinkConfig(t, cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err := s.Publish(context.Background(), testEvents(3, 3)); err != nil {
				t.Fatal(err)
			}
			if err := s.Check(context.Background()); err != nil {
				t.Errorf("Check: %v", err)
			}
			if warned := strings.Contains(logs.String(), "clear text"); warned != (mech == "PLAIN") {
				t.Errorf("clear text warning %v for %s: %s", warned, mech, logs.String())
			}

			cfg.SASL.Password = "wr0ng-pa55"
			_, err := New(context.Background(), cfg, Options{Logger: quiet()})
			if err == nil {
				t.Fatal("New with a wrong password succeeded")
			}
			t.Log(err) // kfake closes the connection; Kafka answers SASL_AUTHENTICATION_FAILED, see below
			if strings.Contains(err.Error(), "wr0ng") || strings.Contains(logs.String(), "s3cret") {
				t.Errorf("a password leaked: %v / %s", err, logs.String())
			}

			cfg.SASL.Password = "s3cret"
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.SASLAuthenticate}, Err: kerr.SaslAuthenticationFailed, TopLevel: true, Count: -1})
			_, err = New(context.Background(), cfg, Options{Logger: quiet()})
			t.Log(err)
			if err == nil || fault.ClassOf(err) == fault.Unavailable || !errors.Is(err, kerr.SaslAuthenticationFailed) {
				t.Errorf("New with SASL_AUTHENTICATION_FAILED: %v (class %v), want a plain error", err, fault.ClassOf(err))
			}
		})
	}
}

// TestTopicAuthorization lets the principal write one topic only: events
// for another topic fail as a failure of that destination (held, never
// dead-lettered), naming the missing grant, and Probe reports the topic.
func TestTopicAuthorization(t *testing.T) {
	allow := func(res kmsg.ACLResourceType, name string, ops ...kmsg.ACLOperation) []kfake.ACL {
		var acls []kfake.ACL
		for _, op := range ops {
			acls = append(acls, kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true})
		}
		return acls
	}
	acls := slices.Concat(
		allow(kmsg.ACLResourceTypeTopic, "ev.order", kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe, kmsg.ACLOperationCreate),
		allow(kmsg.ACLResourceTypeCluster, "kafka-cluster", kmsg.ACLOperationIdempotentWrite),
	)
	c := newCluster(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("SCRAM-SHA-256", "relay", "pw", acls...))
	cfg := Config{Brokers: c.ListenAddrs(), Topic: "ev.{aggregate_type}", SASL: SASL{Mechanism: "SCRAM-SHA-256", Username: "relay", Password: "pw"}}
	s := newSinkConfig(t, cfg, Options{})

	batch := []*event.Event{testEvent(1, "order", "1"), testEvent(2, "invoice", "2"), testEvent(3, "order", "3")}
	err := s.Publish(context.Background(), batch)
	if got := sinktest.Classes(err, 3); !slices.Equal(got, []string{"ok", "unavailable", "ok"}) {
		t.Fatalf("classes %v, want [ok unavailable ok] (err %v)", got, err)
	}
	if s.DestinationOf(batch[1]) != "ev.invoice" {
		t.Errorf("DestinationOf = %q, want ev.invoice", s.DestinationOf(batch[1]))
	}
	if err := s.Probe(context.Background(), "ev.invoice"); fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("Probe(ev.invoice) = %v, want a failure of the destination", err)
	}
	for _, dest := range []string{"ev.order", sink.Broker} {
		if err := s.Probe(context.Background(), dest); err != nil {
			t.Errorf("Probe(%s) = %v", dest, err)
		}
	}
	msg := sink.Failed(err, 1).Error()
	if !strings.Contains(msg, "TOPIC_AUTHORIZATION_FAILED") || !strings.Contains(msg, "ev.invoice") {
		t.Errorf("error %q does not name the topic and the cause", msg)
	}
}

// TestTLS runs a broker that requires a client certificate signed by the
// same self-signed CA it serves.
func TestTLS(t *testing.T) {
	certFile, keyFile, cert := testenv.WriteCert(t)
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	c := newCluster(t, kfake.SeedTopics(1, "t"), kfake.TLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	}))
	cfg := Config{Brokers: c.ListenAddrs(), Topic: "t", TLS: TLS{Enabled: true, CAFile: certFile, CertFile: certFile, KeyFile: keyFile}}
	s := newSinkConfig(t, cfg, Options{})
	if err := s.Publish(context.Background(), testEvents(2, 2)); err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]TLS{
		"no client certificate": {Enabled: true, CAFile: certFile},
		"unknown CA":            {Enabled: true},
		"no TLS":                {},
	} {
		cfg.TLS = tc
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := New(ctx, cfg, Options{Logger: quiet()})
		cancel()
		if err == nil {
			t.Errorf("%s: New succeeded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	cfg.TLS = TLS{Enabled: true, InsecureSkipVerify: true, CertFile: certFile, KeyFile: keyFile}
	if _, err := New(context.Background(), cfg, Options{Logger: quiet()}); err != nil {
		t.Errorf("insecure_skip_verify: %v", err)
	}
	if _, err := tlsConfig(TLS{Enabled: true, CAFile: keyFile}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a key as CA file: %v", err)
	}
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/verify"
)

// TestNATSSecurity runs relay init, check and run against a NATS server
// that requires mutual TLS and a user and password (read from the
// environment): the stream init creates has the configured storage,
// limits and duplicate window, every event arrives in order, and neither
// the password nor the key paths' contents show in the logs.
func TestNATSSecurity(t *testing.T) {
	const password = "n4ts-s3cret"
	certFile, keyFile, cert := testenv.WriteCert(t)
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	srv, err := testenv.StartNATS(testenv.NATSOptions{Configure: func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 10
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		o.Users = []*server.User{{Username: "relay", Password: password}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	t.Setenv("RELAY_TEST_NATS_PASSWORD", password)
	opts := []nats.Option{nats.UserInfo("relay", password), nats.Secure(tc)}
	collect := func() []verify.Delivery { return streamDeliveries(t, srv.URL(), opts...) }
	sinkYAML := fmt.Sprintf(`sink:
  type: nats
  nats:
    url: %s
    username: relay
    password: ${RELAY_TEST_NATS_PASSWORD}
    tls:
      enabled: true
      ca_file: %s
      cert_file: %s
      key_file: %s
    storage: memory
    max_age: 24h
    max_msgs: 100000
    duplicate_window: 1m
`, srv.URL(), certFile, certFile, keyFile)
	s := newStack(t, stackOptions{Sink: sinkYAML, Collect: collect})

	nc, err := nats.Connect(srv.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(context.Background(), "OUTBOX")
	if err != nil {
		t.Fatalf("relay init did not create the stream: %v", err)
	}
	c := st.CachedInfo().Config
	if c.Storage != jetstream.MemoryStorage || c.MaxAge != 24*time.Hour || c.MaxMsgs != 100000 || c.MaxBytes != -1 ||
		c.Duplicates != time.Minute || c.Replicas != 1 {
		t.Errorf("stream created with %+v", c)
	}
	if out, code := runRelay(t, "check", "--config", s.cfgPath); code != 0 || strings.Contains(out, password) {
		t.Errorf("relay check: exit %d\n%s", code, out)
	}

	s.produce(context.Background(), 300, 30, 3)
	relay := s.start()
	s.waitDrained(60 * time.Second)
	if code := relay.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	s.verify()
	if strings.Contains(relay.logs.String(), password) {
		t.Errorf("the relay logged the password:\n%s", relay.logs.String())
	}
}

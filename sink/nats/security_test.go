package nats

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/outboxrelay/relay/event"
	"github.com/outboxrelay/relay/fault"
	"github.com/outboxrelay/relay/internal/testenv"
	"github.com/outboxrelay/relay/internal/tlsconf"
	"github.com/outboxrelay/relay/sink"
)

// securedServer starts an embedded JetStream server whose options
// configure changes.
func securedServer(t *testing.T, configure func(*server.Options)) *testenv.NATS {
	t.Helper()
	return startServer(t, testenv.NATSOptions{Configure: configure})
}

// publishes connects with cfg (URL and subject filled in), creates the
// stream and publishes two events, failing the test on any error.
func publishes(t *testing.T, url string, cfg Config) {
	t.Helper()
	cfg.URL, cfg.Subject, cfg.Stream = url, "outbox.{aggregate_type}", "OUTBOX"
	s, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(context.Background(), testEvents(2, 2)); err != nil {
		t.Fatal(err)
	}
	if n := len(storedMsgs(t, s)); n < 2 {
		t.Fatalf("the stream holds %d messages, want 2", n)
	}
}

// refused checks that New with cfg fails with an error classified
// unavailable (a failure of the destination: the relay never dead-letters
// for it) that does not repeat secret.
func refused(t *testing.T, name, url string, cfg Config, secret string) {
	t.Helper()
	cfg.URL, cfg.Subject, cfg.Stream = url, "outbox.{aggregate_type}", "OUTBOX"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		s.Close()
		t.Errorf("%s: New connected", name)
		return
	}
	t.Logf("%s: %v", name, err)
	if fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("%s: class %v, want unavailable", name, fault.ClassOf(err))
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Errorf("%s: the error repeats the secret: %v", name, err)
	}
}

// TestTLS runs a server that requires TLS with a client certificate signed
// by the self-signed CA it serves.
func TestTLS(t *testing.T) {
	certFile, keyFile, cert := testenv.WriteCert(t)
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	srv := securedServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 10
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	})
	publishes(t, srv.URL(), Config{TLS: tlsconf.Files{Enabled: true, CAFile: certFile, CertFile: certFile, KeyFile: keyFile}})
	publishes(t, strings.Replace(srv.URL(), "nats://", "tls://", 1),
		Config{TLS: tlsconf.Files{Enabled: true, InsecureSkipVerify: true, CertFile: certFile, KeyFile: keyFile}})
	for name, files := range map[string]tlsconf.Files{
		"no client certificate": {Enabled: true, CAFile: certFile},
		"unknown CA":            {Enabled: true, CertFile: certFile, KeyFile: keyFile},
		"no TLS":                {},
	} {
		refused(t, name, srv.URL(), Config{TLS: files}, "")
	}
	_, err := New(context.Background(), Config{URL: srv.URL(), Subject: "s", TLS: tlsconf.Files{Enabled: true, CAFile: keyFile}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "sink.nats.tls.ca_file") {
		t.Errorf("a key as CA file: %v", err)
	}
}

// TestUserPassword and token: the right credentials publish, wrong ones
// are refused without the error repeating them.
func TestUserPassword(t *testing.T) {
	srv := securedServer(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "relay", Password: "s3cret-pw"}}
	})
	publishes(t, srv.URL(), Config{Auth: Auth{Username: "relay", Password: "s3cret-pw"}})
	refused(t, "wrong password", srv.URL(), Config{Auth: Auth{Username: "relay", Password: "wr0ng-pw"}}, "wr0ng-pw")
	refused(t, "no credentials", srv.URL(), Config{}, "")
}

func TestToken(t *testing.T) {
	srv := securedServer(t, func(o *server.Options) { o.Authorization = "t0ken-right" })
	publishes(t, srv.URL(), Config{Auth: Auth{Token: "t0ken-right"}})
	refused(t, "wrong token", srv.URL(), Config{Auth: Auth{Token: "t0ken-wrong"}}, "t0ken-wrong")
}

// TestNKey authenticates with a user nkey seed file.
func TestNKey(t *testing.T) {
	user, seedFile := newUserKey(t)
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	srv := securedServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	publishes(t, srv.URL(), Config{Auth: Auth{NKeyFile: seedFile}})
	_, otherSeed := newUserKey(t)
	refused(t, "unknown nkey", srv.URL(), Config{Auth: Auth{NKeyFile: otherSeed}}, "")
	_, err = New(context.Background(), Config{URL: srv.URL(), Subject: "s", Auth: Auth{NKeyFile: filepath.Join(t.TempDir(), "missing.nk")}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "sink.nats.nkey_file") {
		t.Errorf("a missing nkey file: %v", err)
	}
}

// newUserKey creates a user nkey and writes its seed to a file.
func newUserKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return kp, path
}

// TestCredentialsFile runs a server in operator (JWT) mode with one account
// allowed to use JetStream, and connects with a .creds file of a user of
// that account.
func TestCredentialsFile(t *testing.T) {
	operator, _ := nkeys.CreateOperator()
	opub, _ := operator.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	sysAcc, _ := nkeys.CreateAccount()
	sysPub, _ := sysAcc.PublicKey()
	oc.SystemAccount = sysPub
	ojwt, err := oc.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	operatorClaims, err := jwt.DecodeOperatorClaims(ojwt)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	account := func(kp nkeys.KeyPair, jetStream bool) string {
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		if jetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		token, err := ac.Encode(operator)
		if err != nil {
			t.Fatal(err)
		}
		resolver.Store(pub, token)
		return pub
	}
	account(sysAcc, false)
	appAcc, _ := nkeys.CreateAccount()
	account(appAcc, true)
	creds := func(issuer nkeys.KeyPair) string {
		user, _ := nkeys.CreateUser()
		upub, _ := user.PublicKey()
		ujwt, err := jwt.NewUserClaims(upub).Encode(issuer)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := user.Seed()
		file, err := jwt.FormatUserConfig(ujwt, seed)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "relay.creds")
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	srv := securedServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{operatorClaims}
		o.AccountResolver = resolver
		o.SystemAccount = sysPub
	})
	publishes(t, srv.URL(), Config{Auth: Auth{CredentialsFile: creds(appAcc)}})
	stranger, _ := nkeys.CreateAccount() // an account the server does not know
	refused(t, "user of an unknown account", srv.URL(), Config{Auth: Auth{CredentialsFile: creds(stranger)}}, "")
	_, err = New(context.Background(), Config{URL: srv.URL(), Subject: "s", Auth: Auth{CredentialsFile: filepath.Join(t.TempDir(), "missing.creds")}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "sink.nats.credentials_file") {
		t.Errorf("a missing credentials file: %v", err)
	}
}

// TestPublishDenied runs the relay's user with exactly the permissions
// docs/configuration.md lists: creating the stream, publishing, and both
// probes work. Publishes to a subject outside them fail as a failure of the
// destination (the relay holds them, never dead-letters them).
func TestPublishDenied(t *testing.T) {
	srv := securedServer(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "relay", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"outbox.order",
				"$JS.API.INFO", "$JS.API.STREAM.INFO.OUTBOX", "$JS.API.STREAM.CREATE.OUTBOX", "$JS.API.STREAM.NAMES"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}}
	})
	cfg := Config{URL: srv.URL(), Subject: "outbox.{aggregate_type}", Stream: "OUTBOX", Auth: Auth{Username: "relay", Password: "pw"}}
	s, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler), AckTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(context.Background(), testEvents(1, 1)); err != nil {
		t.Fatalf("allowed subject: %v", err)
	}
	for _, dest := range []string{sink.Broker, "outbox.order"} {
		if err := s.Probe(context.Background(), dest); err != nil {
			t.Errorf("probe %s: %v", dest, err)
		}
	}
	if err := s.Check(context.Background()); err != nil {
		t.Errorf("check: %v", err)
	}
	err = sink.Failed(s.Publish(context.Background(), []*event.Event{testEvent(2, "secret", "a")}), 0)
	t.Logf("denied subject: %v", err)
	if err == nil || fault.ClassOf(err) != fault.Unavailable {
		t.Errorf("denied subject: got %v (class %v), want an unavailable error", err, fault.ClassOf(err))
	}
}

// TestStreamSettings creates the stream with every setting and reads them
// back; a relay configured otherwise finds the stream, leaves it as it is
// and warns about each difference.
func TestStreamSettings(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	settings := StreamSettings{Replicas: 1, Memory: true, MaxAge: time.Hour, MaxBytes: 1 << 20, MaxMsgs: 1000, DuplicateWindow: 30 * time.Second}
	cfg := Config{URL: srv.URL(), Subject: "outbox.{aggregate_type}", Stream: "OUTBOX", StreamSettings: settings}
	s, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	info, err := stream(t, s).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.Replicas != 1 || c.Storage != jetstream.MemoryStorage || c.MaxAge != time.Hour || c.MaxBytes != 1<<20 ||
		c.MaxMsgs != 1000 || c.Duplicates != 30*time.Second || c.Discard != jetstream.DiscardOld {
		t.Errorf("stream config %+v does not match %+v", c, settings)
	}

	var logs bytes.Buffer
	cfg.StreamSettings = StreamSettings{}
	other, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	if err := other.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	info, err = stream(t, other).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Storage != jetstream.MemoryStorage || info.Config.MaxMsgs != 1000 {
		t.Errorf("the existing stream was changed: %+v", info.Config)
	}
	for _, key := range []string{"storage", "max_age", "max_bytes", "max_msgs", "duplicate_window"} {
		if !strings.Contains(logs.String(), "setting="+key) {
			t.Errorf("no warning about %s:\n%s", key, logs.String())
		}
	}
	if strings.Contains(logs.String(), "setting=replicas") {
		t.Errorf("a warning about replicas, which match:\n%s", logs.String())
	}
}

// TestStreamDefaults checks the stream created without settings: one
// replica, file storage, no limits, a 2 minute duplicate window.
func TestStreamDefaults(t *testing.T) {
	srv := startServer(t, testenv.NATSOptions{})
	s := newStreamSink(t, srv.URL(), Options{})
	info, err := stream(t, s).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := info.Config
	if c.Replicas != 1 || c.Storage != jetstream.FileStorage || c.MaxAge != 0 || c.MaxBytes != -1 || c.MaxMsgs != -1 || c.Duplicates != 2*time.Minute {
		t.Errorf("default stream config %+v", c)
	}
}

// TestCredentialsRotatedWhileRunning changes the relay's password on the
// server while the sink is connected: the server drops the connection and
// refuses every reconnect, publishes fail as failures of the destination,
// and once the server takes the password again the sink reconnects by
// itself and publishes. (By default the NATS client gives up for good after
// the second identical authentication error.) The server runs as a process
// of its own: the embedded server's configuration reload races internally.
func TestCredentialsRotatedWhileRunning(t *testing.T) {
	users := func(password string) string {
		return fmt.Sprintf("authorization { users = [ { user: relay, password: %q } ] }", password)
	}
	srv := testenv.StartNATSProcess(t, users("pw-1"))
	var logs testenv.SyncBuffer
	cfg := Config{URL: srv.URL(), Subject: "outbox.{aggregate_type}", Stream: "OUTBOX", Auth: Auth{Username: "relay", Password: "pw-1"}}
	s, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), AckTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(context.Background(), testEvents(1, 1)); err != nil {
		t.Fatal(err)
	}

	if err := srv.Reload(users("pw-2")); err != nil {
		t.Fatal(err)
	}
	// Wait until the client has been refused at least twice on reconnect.
	waitUntil(t, "two refused reconnects", func() bool {
		return strings.Count(strings.ToLower(logs.String()), "authorization violation") >= 2
	}, &logs)
	err = sink.Failed(s.Publish(context.Background(), []*event.Event{testEvent(2, "order", "0")}), 0)
	if err == nil || fault.ClassOf(err) != fault.Unavailable {
		t.Fatalf("publish while refused: got %v (class %v), want an unavailable error", err, fault.ClassOf(err))
	}

	if err := srv.Reload(users("pw-1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a publish after the password is accepted again", func() bool {
		return s.Publish(context.Background(), []*event.Event{testEvent(2, "order", "0")}) == nil
	}, &logs)
	if strings.Contains(logs.String(), "pw-1") || strings.Contains(logs.String(), "pw-2") {
		t.Errorf("a password was logged:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"nats error\""); n != 1 {
		t.Errorf("%d warnings about the refused reconnects, want 1 (the repeats at debug level):\n%s", n, logs.String())
	}
}

// waitUntil polls cond for up to 30s.
func waitUntil(t *testing.T, what string, cond func() bool, logs *testenv.SyncBuffer) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s; sink log:\n%s", what, logs)
		}
	}
}

package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/testenv"
)

// fakeTokens stands in for the RDS token signer: it hands out the token
// set last and records every request.
type fakeTokens struct {
	mu       sync.Mutex
	token    string
	requests []string // endpoint and user of each request
}

func (f *fakeTokens) set(tok string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token = tok
}

func (f *fakeTokens) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func (f *fakeTokens) source(context.Context, string) (tokenSource, error) {
	return func(_ context.Context, endpoint, user string) (string, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.requests = append(f.requests, endpoint+" "+user)
		return f.token, nil
	}, nil
}

// TestIAMAuthTokenPerConnection runs a real PostgreSQL that requires a
// password (scram-sha-256) from a role whose password is the current
// "token": every connection the relay opens — pooled, a dedicated pgx
// connection and a replication-style pgconn one, both from copies of the
// pool's config as capture makes them — asks for a token for the URL's
// host, port and user, and signs in with it; after the password rotates, a
// new connection signs in with the new token, and a stale token is refused,
// so the token is what reaches the server and it is not cached. Without
// postgres.aws_iam_auth the role cannot sign in.
func TestIAMAuthTokenPerConnection(t *testing.T) {
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	admin, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	hba := filepath.Join(pg.Dir(), "data", "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	rule := "host all iam_user 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hba, append([]byte(rule), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{`CREATE ROLE iam_user LOGIN PASSWORD 'token-1'`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	fake := &fakeTokens{token: "token-1"}
	saved := newTokenSource
	newTokenSource = fake.source
	t.Cleanup(func() { newTokenSource = saved })

	url := fmt.Sprintf("postgres://iam_user@127.0.0.1:%d/postgres?sslmode=disable", pg.Port())
	if _, err := connect(ctx, config.Postgres{URL: url}, 2); err == nil || !strings.Contains(err.Error(), "password") {
		t.Fatalf("without aws_iam_auth: %v, want a password failure", err)
	}
	pool, err := connect(ctx, config.Postgres{URL: url, AWSIAMAuth: config.AWSIAMAuth{Region: "eu-west-1"}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var held []interface{ Release() }
	for range 3 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	want := fmt.Sprintf("127.0.0.1:%d iam_user", pg.Port())
	calls := fake.calls()
	if len(calls) != 3 || calls[0] != want {
		t.Fatalf("token requests %q: want 3 (one per pooled connection) of %q", calls, want)
	}

	// Capture's dedicated connections copy the pool's config.
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("dedicated connection: %v", err)
	}
	conn.Close(ctx)
	if _, err := admin.Exec(ctx, `ALTER ROLE iam_user PASSWORD 'token-2'`); err != nil {
		t.Fatal(err)
	}
	fake.set("token-2")
	repl := pool.Config().ConnConfig.Config.Copy()
	pc, err := pgconn.ConnectConfig(ctx, repl)
	if err != nil {
		t.Fatalf("pgconn connection after the rotation: %v", err)
	}
	pc.Close(ctx)
	if n := len(fake.calls()); n != 5 {
		t.Errorf("%d token requests after two more connections, want 5", n)
	}
	fake.set("token-1")
	if _, err := pgconn.ConnectConfig(ctx, repl); err == nil || !strings.Contains(err.Error(), "password authentication failed") {
		t.Errorf("a stale token: %v, want the server to refuse it", err)
	}
}

// TestIAMTokenSigned checks the real token source: with static credentials
// in the environment it signs an RDS connect token for the endpoint, user
// and region.
func TestIAMTokenSigned(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	tokens, err := newTokenSource(context.Background(), "eu-west-1")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokens(context.Background(), "orders.cluster-abc.eu-west-1.rds.amazonaws.com:5432", "relay")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"orders.cluster-abc.eu-west-1.rds.amazonaws.com:5432?", "Action=connect", "DBUser=relay",
		"X-Amz-Credential=AKIDEXAMPLE%2F", "%2Feu-west-1%2Frds-db%2Faws4_request", "X-Amz-Expires=900", "X-Amz-Signature="} {
		if !strings.Contains(tok, want) {
			t.Errorf("token %q lacks %q", tok, want)
		}
	}
}

package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/helpers/outbox"
	"github.com/outboxrelay/relay/internal/embedded"
)

// The servers, re-exported from internal/embedded so that a test needs one
// import; see there for their documentation.
type (
	Postgres        = embedded.Postgres
	PostgresOptions = embedded.PostgresOptions
	NATS            = embedded.NATS
	NATSOptions     = embedded.NATSOptions
)

// The server starters and lookups of internal/embedded.
var (
	StartPostgres = embedded.StartPostgres
	StartNATS     = embedded.StartNATS
	PostgresBin   = embedded.PostgresBin
	FreePort      = embedded.FreePort
)

// PostgresMajors are the PostgreSQL major versions the relay supports; the
// version tests run on each.
var PostgresMajors = embedded.PostgresMajors

// ContractOutbox is the outbox table of docs/reference.md, as an application
// creates it with the helpers' outbox.TableDDL: tests and the bench use it to
// check the relay against the contract's own DDL, not against what relay init
// would create.
const ContractOutbox = outbox.TableDDL

var (
	shared struct {
		once sync.Once
		pg   *Postgres
		err  error
	}
	dbSeq atomic.Int64

	exitMu    sync.Mutex // guards exitFuncs
	exitFuncs []func()
)

// NewDB returns the DSN of a new, uniquely named database in the package's
// shared cluster, which the first call starts (once per test binary). The
// database is dropped, with its replication slots, when the test ends. It is
// safe to call from parallel tests. The test package's TestMain should call
// Main, which stops the shared cluster when the tests end (without it, the
// cluster's watchdog stops it after the test binary exits). If the cluster
// cannot start, NewDB fails the test with the reason. with is appended to
// the CREATE DATABASE statement (see Postgres.CreateDatabase), for example to
// make a SQL_ASCII database.
func NewDB(t testing.TB, with ...string) string {
	t.Helper()
	pg, err := sharedPostgres()
	if err != nil {
		t.Fatalf("testenv.NewDB: start the shared PostgreSQL cluster: %v", err)
	}
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := pg.CreateDatabase(ctx, name, with...)
	if err != nil {
		t.Fatalf("testenv.NewDB: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pg.DropDatabase(ctx, name); err != nil {
			t.Logf("testenv.NewDB cleanup: %v", err)
		}
	})
	return dsn
}

// sharedPostgres starts the shared cluster once and registers its Stop.
func sharedPostgres() (*Postgres, error) {
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.pg, shared.err = StartPostgres(ctx, PostgresOptions{})
		if shared.err == nil {
			OnExit(func() { _ = shared.pg.Stop() })
		}
	})
	return shared.pg, shared.err
}

// dbName returns a unique database name derived from a test name, at most
// 63 bytes of [a-z0-9_].
func dbName(test string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "t%d_", dbSeq.Add(1))
	for _, r := range strings.ToLower(test) {
		if b.Len() >= 63 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Main is for a test package's TestMain: it runs the tests, then the
// functions registered with OnExit (which stop the shared cluster), and
// exits with the tests' status. Servers of a test binary that dies before
// (a panic, go test -timeout, a signal) are stopped by their watchdogs.
func Main(m *testing.M) {
	code := m.Run()
	runExitFuncs()
	os.Exit(code)
}

// OnExit registers f to run when Main finishes, after the tests; functions
// run once each, the last registered first. It is safe for concurrent use.
func OnExit(f func()) {
	exitMu.Lock()
	defer exitMu.Unlock()
	exitFuncs = append(exitFuncs, f)
}

// runExitFuncs runs and forgets the registered functions, last first.
func runExitFuncs() {
	exitMu.Lock()
	fs := exitFuncs
	exitFuncs = nil
	exitMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

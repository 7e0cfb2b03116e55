package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// pgbouncerWrapper runs PgBouncer (arguments: the binary, then its
// arguments) and kills it when its standard input reaches EOF, which
// happens when the test binary exits or closes the pipe, so that no
// PgBouncer outlives the tests.
const pgbouncerWrapper = `"$@" & pid=$!
read -r _
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exit 0`

// StartPgBouncer starts a PgBouncer (Debian package pgbouncer, see
// scripts/deps.sh) in front of the database of dsn, a URL of the shared
// cluster as NewDB returns it, with pool_mode (transaction, session or
// statement), trust authentication for the URL's user and at most 10
// server connections; it listens on a free port of 127.0.0.1 and returns
// the URL of the same database through it. Run as root, PgBouncer assumes
// the identity of user postgres, since it refuses to run as root. It is
// stopped when the test ends; a missing binary fails the test.
func StartPgBouncer(t testing.TB, dsn, poolMode string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/pgbouncer"); err != nil {
			t.Fatal("testenv: pgbouncer not found: run scripts/deps.sh (or apt-get install pgbouncer)")
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "relay-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	user, db := u.User.Username(), u.Path[1:]
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = 10
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
`, db, u.Hostname(), u.Port(), db, port, filepath.Join(dir, "userlist.txt"), poolMode)
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("userlist.txt", strconv.Quote(user)+` ""`+"\n")
	write("pgbouncer.ini", ini)
	args := []string{"-c", pgbouncerWrapper, "pgbouncer", bin}
	if os.Geteuid() == 0 {
		args = append(args, "-u", pgUser)
	}
	cmd := exec.Command("sh", append(args, filepath.Join(dir, "pgbouncer.ini"))...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", out.String())
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: pgbouncer does not listen on %s: %v\n%s", addr, err, out.String())
		}
	}
	u.Host = addr
	return u.String()
}

// pgUser is the OS user PgBouncer runs as when the tests run as root: the
// one the shared cluster runs as.
const pgUser = "postgres"

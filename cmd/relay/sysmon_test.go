package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestRunCalmsSysmon checks that `relay run` re-executes itself, keeping
// its process id, with schedtrace added to the GODEBUG it was given (see
// app.CalmSysmon), and that a GODEBUG that sets schedtrace is left alone:
// the environment is read once the relay is ready, after any re-execution.
func TestRunCalmsSysmon(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	rewriteDSN(t, s.cfgPath, "shutdown_timeout:", "http:\n  listen: "+addr+"\nshutdown_timeout:")
	for _, tc := range []struct{ given, want string }{
		{"madvdontneed=1", "GODEBUG=madvdontneed=1,schedtrace=2147483647"},
		{"schedtrace=0", "GODEBUG=schedtrace=0"},
	} {
		cmd := exec.Command(relayBin, "run", "--config", s.cfgPath)
		cmd.Env = append(os.Environ(), "GODEBUG="+tc.given)
		var logs testenv.SyncBuffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
		env := processGODEBUG(t, cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if env != tc.want {
			t.Fatalf("GODEBUG %q: the running relay has %q, want %q; log:\n%s", tc.given, env, tc.want, logs.String())
		}
	}
}

// processGODEBUG returns the GODEBUG entry of the environment process pid
// was started, or executed, with.
func processGODEBUG(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if strings.HasPrefix(kv, "GODEBUG=") {
			return kv
		}
	}
	return ""
}

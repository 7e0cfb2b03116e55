package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/testenv"
)

// TestRunDoesNotReexec checks that `relay run` runs with the environment
// it was started with: it does not execute itself again (an exec at start
// loses signals sent meanwhile, runs init twice and confuses debuggers),
// so the GODEBUG the container image sets (schedtrace, see
// docs/operations.md) is the operator's to see and change. The
// environment is read once the relay is ready.
func TestRunDoesNotReexec(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	rewriteDSN(t, s.cfgPath, "shutdown_timeout:", "http:\n  listen: "+addr+"\nshutdown_timeout:")
	for _, given := range []string{"", "madvdontneed=1"} {
		cmd := exec.Command(relayBin, "run", "--config", s.cfgPath)
		cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
		want := ""
		if given != "" {
			want = "GODEBUG=" + given
			cmd.Env = append(cmd.Env, want)
		}
		var logs testenv.SyncBuffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return readyz(addr) == http.StatusOK })
		env := processGODEBUG(t, cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if env != want {
			t.Fatalf("GODEBUG %q: the running relay has %q; log:\n%s", given, env, logs.String())
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

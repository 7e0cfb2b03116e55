package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRunCalmsSysmon checks that `relay run` re-executes itself, keeping
// its process id, with schedtrace added to the GODEBUG it was given (see
// app.CalmSysmon), and that a GODEBUG that sets schedtrace is left alone.
func TestRunCalmsSysmon(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	for _, tc := range []struct{ given, want string }{
		{"madvdontneed=1", "GODEBUG=madvdontneed=1,schedtrace=2147483647"},
		{"schedtrace=0", "GODEBUG=schedtrace=0"},
	} {
		cmd := exec.Command(relayBin, "run", "--config", s.cfgPath)
		cmd.Env = append(os.Environ(), "GODEBUG="+tc.given)
		var logs bytes.Buffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		env := waitGODEBUG(t, cmd.Process.Pid, tc.want)
		cmd.Process.Kill()
		cmd.Wait()
		if env != tc.want {
			t.Fatalf("GODEBUG %q: the running relay has %q, want %q; log:\n%s", tc.given, env, tc.want, logs.String())
		}
	}
}

// waitGODEBUG returns the GODEBUG entry of process pid's environment once
// it is want, or the last one seen after a minute.
func waitGODEBUG(t *testing.T, pid int, want string) string {
	t.Helper()
	var got string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		got = ""
		for _, kv := range strings.Split(string(b), "\x00") {
			if strings.HasPrefix(kv, "GODEBUG=") {
				got = kv
			}
		}
		if got == want {
			return got
		}
	}
	return got
}

package app

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// CalmSysmon re-executes the running binary, with the same arguments and
// process id, adding schedtrace=sysmonTrace to GODEBUG, unless GODEBUG
// already sets schedtrace (schedtrace=0 keeps the runtime's default). It
// returns only when it did not re-execute: the setting was there, or exec
// failed.
//
// The Go runtime's monitor thread (sysmon) sleeps while every P is idle
// and is woken by the next system call; after that wake it polls every
// 20 µs for dozens of rounds before backing off. A relay in steady state
// goes idle and wakes with a system call hundreds of times a second, so
// the monitor never backs off: with GOMAXPROCS=1 it made half of the
// process's context switches. With schedtrace set the monitor never
// sleeps that way and backs off to a 10 ms poll instead (golang/go#18236).
// The runtime then writes one scheduler line to standard error every
// sysmonTrace milliseconds (about 25 days), and a scheduler dump with a
// fatal error.
func CalmSysmon() {
	godebug := os.Getenv("GODEBUG")
	for _, kv := range strings.Split(godebug, ",") {
		if strings.HasPrefix(strings.TrimSpace(kv), "schedtrace=") {
			return
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	if godebug != "" {
		godebug += ","
	}
	godebug += "schedtrace=" + sysmonTrace
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") })
	_ = syscall.Exec(exe, os.Args, append(env, "GODEBUG="+godebug))
}

// sysmonTrace is the schedtrace period CalmSysmon sets, in milliseconds:
// the largest the runtime takes.
const sysmonTrace = "2147483647"

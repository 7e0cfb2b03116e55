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
// failed. In the re-executed process it puts GODEBUG back as it was given,
// for the processes the relay starts (credential helpers); the runtime
// keeps the setting it read at start.
//
// The Go runtime's monitor thread (sysmon) sleeps while every P is idle
// and is woken by the next system call; after that wake it polls every
// 20 µs for dozens of rounds before backing off. A relay in steady state
// goes idle and wakes with a system call hundreds of times a second, so
// the monitor never backs off: with GOMAXPROCS=1 it made half of the
// process's context switches. With schedtrace set the monitor never
// sleeps that way and polls every 10 ms instead, also while the relay is
// idle (golang/go#18236). The runtime then writes a scheduler line to
// standard error whenever sysmonTrace milliseconds have passed since the
// host booted (at start on a host up longer than that, about 25 days), and
// a scheduler dump with a fatal error.
func CalmSysmon() {
	if given, ok := os.LookupEnv(givenGODEBUG); ok {
		os.Unsetenv(givenGODEBUG)
		if given == "" {
			os.Unsetenv("GODEBUG")
		} else {
			os.Setenv("GODEBUG", given)
		}
		return
	}
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
	calmed := "schedtrace=" + sysmonTrace
	if godebug != "" {
		calmed = godebug + "," + calmed
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GODEBUG=") || strings.HasPrefix(kv, givenGODEBUG+"=")
	})
	_ = syscall.Exec(exe, os.Args, append(env, "GODEBUG="+calmed, givenGODEBUG+"="+godebug))
}

// sysmonTrace is the schedtrace period CalmSysmon sets, in milliseconds:
// the largest the runtime takes.
const sysmonTrace = "2147483647"

// givenGODEBUG is the environment variable in which CalmSysmon passes the
// GODEBUG the relay was given to the re-executed process.
const givenGODEBUG = "RELAY_GIVEN_GODEBUG"

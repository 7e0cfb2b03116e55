package app

import (
	"os"
	"testing"
)

// TestCalmSysmonRestoresGODEBUG: in the re-executed relay, GODEBUG is put
// back as the relay was given it (unset when it had none), for the
// processes the relay starts, and the variable that carried it is gone.
func TestCalmSysmonRestoresGODEBUG(t *testing.T) {
	for _, given := range []string{"madvdontneed=1", ""} {
		t.Setenv("GODEBUG", given+",schedtrace="+sysmonTrace)
		t.Setenv(givenGODEBUG, given)
		CalmSysmon()
		godebug, set := os.LookupEnv("GODEBUG")
		if _, left := os.LookupEnv(givenGODEBUG); godebug != given || set != (given != "") || left {
			t.Errorf("given %q: GODEBUG %q (set %v), %s left %v", given, godebug, set, givenGODEBUG, left)
		}
	}
}

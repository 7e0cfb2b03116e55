package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// statusJSON is the part of `relay status --json` the tests read.
type statusJSON struct {
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
	Warnings []string `json:"warnings"`
	Mode     string   `json:"mode"`
	Outbox   struct {
		Unpublished int64 `json:"unpublished"`
	} `json:"outbox"`
	Slot *struct {
		Exists        bool   `json:"exists"`
		Active        bool   `json:"active"`
		WALStatus     string `json:"wal_status"`
		RetainedBytes int64  `json:"retained_wal_bytes"`
	} `json:"slot"`
	Relays []struct {
		PID        int32   `json:"pid"`
		Role       string  `json:"role"`
		Partitions []int32 `json:"partitions"`
	} `json:"relays"`
	Partitions *struct {
		Total   int     `json:"total"`
		Unowned []int32 `json:"unowned"`
	} `json:"partitions"`
	DeadLetters []struct {
		ErrorClass string `json:"error_class"`
		Count      int64  `json:"count"`
	} `json:"dead_letters"`
	Live *struct {
		Error     string `json:"error"`
		Capturing bool   `json:"capturing"`
		Leading   *bool  `json:"leading"`
		Broken    []struct {
			Name string `json:"name"`
		} `json:"broken_destinations"`
	} `json:"live"`
}

// relayStatus runs `relay status --json` on path and decodes its report.
func relayStatus(t *testing.T, path string) (statusJSON, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, relayBin, "status", "--json", "--config", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	out := stdout.String()
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("relay status --json: exit %d, not JSON: %v\n%s%s", code, err, out, stderr.String())
	}
	return st, code, out
}

// withListen writes a copy of the config at path that serves HTTP on
// another free port, for a second relay on the same database, and returns
// it with that address.
func withListen(t *testing.T, path string) (string, string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return writeConfig(t, string(b)+"http:\n  listen: "+addr+"\n"), addr
}

// TestStatus runs `relay status` as the least-privileged role relay run
// uses, in both capture modes, against two running relays: healthy with
// one streaming and one standing by (wal) or the partitions shared (poll),
// dead letters counted by error class with the control characters of a
// hostile class escaped in both outputs, a broken sink reported from the
// running relay's /status (exit 1), and every relay stopped reported as
// unhealthy (exit 1). Bad usage exits 2.
func TestStatus(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"wal", "poll"} {
		t.Run(mode, func(t *testing.T) { testStatus(t, mode) })
	}
}

func testStatus(t *testing.T, mode string) {
	s := newStack(t, stackOptions{Mode: mode, LeastPrivilege: true})
	ctx := context.Background()
	first, addr1 := withListen(t, s.cfgPath)
	second, addr2 := withListen(t, s.cfgPath)
	r1 := startProc(t, ctx, "run", "--config", first)
	waitFor(t, func() bool { return readyz(addr1) == 200 })
	r2 := startProc(t, ctx, "run", "--config", second)
	waitFor(t, func() bool { return readyz(addr2) == 200 })
	s.produce(ctx, 100, 10, 2)
	s.waitDrained(60 * time.Second)

	var st statusJSON
	waitFor(t, func() bool {
		var code int
		st, code, _ = relayStatus(t, first)
		return code == 0 && len(st.Relays) == 2 && (mode == "wal" || len(st.Relays[0].Partitions) == 8 && len(st.Relays[1].Partitions) == 8)
	})
	if !st.Healthy || st.Mode != mode || st.Outbox.Unpublished != 0 || st.Live == nil || st.Live.Error != "" || !st.Live.Capturing {
		t.Fatalf("status of two running relays: %+v", st)
	}
	switch mode {
	case "wal":
		roles := []string{st.Relays[0].Role, st.Relays[1].Role}
		if st.Slot == nil || !st.Slot.Exists || !st.Slot.Active || st.Slot.WALStatus != "reserved" || st.Slot.RetainedBytes < 0 ||
			!(roles[0] == "streaming" && roles[1] == "standby") {
			t.Fatalf("wal status: slot %+v, relays %+v", st.Slot, st.Relays)
		}
		if st.Live.Leading == nil || !*st.Live.Leading {
			t.Errorf("the first relay's /status says it does not lead: %+v", st.Live)
		}
	case "poll":
		if st.Partitions.Total != 16 || len(st.Relays[0].Partitions)+len(st.Relays[1].Partitions) != 16 ||
			len(st.Relays[0].Partitions) != 8 || st.Relays[0].Role != "polling" {
			t.Fatalf("poll status: partitions %+v, relays %+v", st.Partitions, st.Relays)
		}
	}

	// A dead letter whose error_class is hostile: counted, escaped, a
	// warning only.
	hostile := "evil\x1b[2J\r\nclass\u202e"
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox_dead_letter (id, aggregate_type, aggregate_id, event_type, payload, error, error_class, attempts, first_failed_at, last_failed_at)
		VALUES ($1, 'order', 'x', 'e', '{}', 'boom', $2, 1, now(), now())`, uuid.NewString(), hostile); err != nil {
		t.Fatal(err)
	}
	st, code, out := relayStatus(t, first)
	if code != 0 || len(st.DeadLetters) != 1 || st.DeadLetters[0].Count != 1 || len(st.Warnings) != 1 {
		t.Fatalf("status with a dead letter: exit %d\n%s", code, out)
	}
	if strings.ContainsAny(out, "\x1b\r\u202e") || !strings.Contains(st.DeadLetters[0].ErrorClass, `\x1b[2J\r\nclass\u202e`) {
		t.Errorf("the dead letter's class is not escaped in --json: %q", st.DeadLetters[0].ErrorClass)
	}
	text, code := runRelay(t, "status", "--config", first)
	if code != 0 || !strings.Contains(text, "relay status: HEALTHY") || strings.ContainsAny(text, "\x1b\r\u202e") ||
		!strings.Contains(text, `evil\x1b[2J\r\nclass\u202e`) {
		t.Fatalf("relay status (text): exit %d\n%s", code, text)
	}
	t.Logf("relay status (%s):\n%s", mode, text)

	// The broker goes away: the running relay reports its destination
	// broken or capture failing, and status says unhealthy.
	s.nats.Shutdown()
	s.produce(ctx, 10, 2, 1)
	waitFor(t, func() bool {
		st, code, _ = relayStatus(t, first)
		return code == 1 && st.Live != nil && len(st.Live.Broken) > 0
	})

	r1.kill()
	r2.kill()
	waitFor(t, func() bool {
		st, code, out = relayStatus(t, s.cfgPath)
		return code == 1 && len(st.Relays) == 0
	})
	if !strings.Contains(out, "no relay runs on outbox public.outbox") || st.Live != nil {
		t.Errorf("status without relays (and without http.listen): %s", out)
	}
	if _, code, _ := relayStatus(t, first); code != 1 {
		t.Errorf("status with an unreachable http.listen: exit %d, want 1", code)
	}
	for _, args := range [][]string{{"status"}, {"status", "--config", first, "extra"}, {"status", "--config", first, "--endpoint", "ftp://x"}, {"status", "--config", first, "--max-age", "0s"}} {
		if out, code := runRelay(t, args...); code != 2 {
			t.Errorf("relay %q: exit %d, want 2\n%s", args, code, out)
		}
	}
}

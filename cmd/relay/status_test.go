package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxrelay/relay/internal/testenv"
)

// statusJSON is the part of `relay status --json` the tests read.
type statusJSON struct {
	Healthy  bool     `json:"healthy"`
	Problems []string `json:"problems"`
	Warnings []string `json:"warnings"`
	Mode     string   `json:"mode"`
	Database struct {
		Reachable bool   `json:"reachable"`
		Error     string `json:"error"`
	} `json:"database"`
	Outbox *struct {
		Unpublished int64 `json:"unpublished"`
	} `json:"outbox"`
	Slot *struct {
		Name          string `json:"name"`
		Exists        bool   `json:"exists"`
		Active        bool   `json:"active"`
		WALStatus     string `json:"wal_status"`
		RetainedBytes int64  `json:"retained_wal_bytes"`
	} `json:"slot"`
	Relays     []relayJSON `json:"relays"`
	Partitions *struct {
		Total   int     `json:"total"`
		Unowned []int32 `json:"unowned"`
	} `json:"partitions"`
	DeadLetters []struct {
		ErrorClass string `json:"error_class"`
		Count      int64  `json:"count"`
	} `json:"dead_letters"`
}

// relayJSON is one relay of statusJSON.
type relayJSON struct {
	Address    string  `json:"address"`
	FoundBy    string  `json:"found_by"`
	BackendPID int32   `json:"backend_pid"`
	Role       string  `json:"role"`
	Partitions []int32 `json:"partitions"`
	Live       *struct {
		URL       string `json:"url"`
		Error     string `json:"error"`
		Address   string `json:"address"`
		Hostname  string `json:"hostname"`
		PID       int    `json:"pid"`
		Starting  string `json:"starting"`
		Capturing bool   `json:"capturing"`
		Leading   *bool  `json:"leading"`
		Broken    []struct {
			Name string `json:"name"`
		} `json:"broken_destinations"`
	} `json:"live"`
}

// broken reports whether a relay of st says a destination is broken.
func (st statusJSON) broken() bool {
	for _, r := range st.Relays {
		if r.Live != nil && len(r.Live.Broken) > 0 {
			return true
		}
	}
	return false
}

// relayStatus runs `relay status --json` on path, with args, and decodes
// its report.
func relayStatus(t *testing.T, path string, args ...string) (statusJSON, int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, relayBin, append([]string{"status", "--json", "--config", path}, args...)...)
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
	if !st.Healthy || st.Mode != mode || st.Outbox.Unpublished != 0 || !st.Database.Reachable {
		t.Fatalf("status of two running relays: %+v", st)
	}
	for _, r := range st.Relays {
		if r.Live == nil || r.Live.Error != "" || !r.Live.Capturing || r.FoundBy != "database" || r.BackendPID == 0 {
			t.Fatalf("status of two running relays: %+v", st)
		}
	}
	switch mode {
	case "wal":
		roles := []string{st.Relays[0].Role, st.Relays[1].Role}
		if st.Slot == nil || !st.Slot.Exists || !st.Slot.Active || st.Slot.WALStatus != "reserved" || st.Slot.RetainedBytes < 0 ||
			!(roles[0] == "streaming" && roles[1] == "standby") {
			t.Fatalf("wal status: slot %+v, relays %+v", st.Slot, st.Relays)
		}
		if l := st.Relays[0].Live; l.Leading == nil || !*l.Leading || l.Address != addr1 {
			t.Errorf("the first relay's /status says it does not lead, or another address than %s: %+v", addr1, l)
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
	plain := []string{"nothing unpublished", "postgres backend pid", "every destination works"}
	if mode == "poll" {
		plain = append(plain, "partitions    16, each owned by a relay")
	}
	for _, p := range plain {
		if !strings.Contains(text, p) {
			t.Errorf("relay status (text) does not say %q", p)
		}
	}
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
		return code == 1 && st.broken()
	})

	r1.kill()
	r2.kill()
	waitFor(t, func() bool {
		st, code, out = relayStatus(t, s.cfgPath)
		return code == 1 && len(st.Relays) == 0
	})
	if !strings.Contains(out, "no relay runs on outbox public.outbox") {
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

// TestStatusFleet runs `relay status` on two wal relays from three places,
// each relay's config (its own http.listen) and one without http.listen,
// and gets the same fleet and verdict from each: both relays by the
// address they advertise, the one streaming and the one standing by, each
// with its own answer. With Postgres stopped, status says the database is
// unreachable (exit 1) and still shows what both relays say: it asks the
// relay at http.listen, or at --endpoint, and the peer that one last saw.
func TestStatusFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dsn, err := pg.CreateDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{DSN: dsn, Mode: "wal", LeastPrivilege: true})
	first, addr1 := withListen(t, s.cfgPath)
	second, addr2 := withListen(t, s.cfgPath)
	r1 := startProc(t, ctx, "run", "--config", first)
	waitFor(t, func() bool { return readyz(addr1) == 200 })
	r2 := startProc(t, ctx, "run", "--config", second)
	waitFor(t, func() bool { return readyz(addr2) == 200 })

	want := fmt.Sprintf("%s streaming leading=true pid=%d; %s standby leading=false pid=%d; ",
		addr1, r1.cmd.Process.Pid, addr2, r2.cmd.Process.Pid)
	fleet := func(st statusJSON) string {
		var b strings.Builder
		for _, r := range st.Relays {
			fmt.Fprintf(&b, "%s %s", r.Address, r.Role)
			if l := r.Live; l != nil && l.Error == "" && l.Leading != nil && l.Address == r.Address && l.Capturing {
				fmt.Fprintf(&b, " leading=%v pid=%d", *l.Leading, l.PID)
			}
			b.WriteString("; ")
		}
		return b.String()
	}
	for _, path := range []string{first, second, s.cfgPath} {
		var st statusJSON
		var code int
		var out string
		waitFor(t, func() bool {
			st, code, out = relayStatus(t, path)
			return code == 0 && fleet(st) == want
		})
		if !st.Healthy || !st.Database.Reachable || len(st.Problems) > 0 || st.Relays[0].FoundBy != "database" {
			t.Fatalf("status from %s: exit %d\n%s", path, code, out)
		}
	}
	text, code := runRelay(t, "status", "--config", second)
	if code != 0 || !regexp.MustCompile(addr1+` +streaming`).MatchString(text) || !regexp.MustCompile(addr2+` +standby`).MatchString(text) ||
		!strings.Contains(text, "(streams)") || !strings.Contains(text, "(stands by)") {
		t.Fatalf("relay status (text): exit %d\n%s", code, text)
	}
	t.Logf("relay status:\n%s", text)

	// Each relay reads its peers every 15 s; the first one read them
	// before the second started.
	waitFor(t, func() bool { return strings.Contains(get(addr1, "/status"), addr2) })
	if err := pg.StopServer(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path    string
		args    []string
		asked   string
		foundBy [2]string
	}{
		{first, nil, addr1, [2]string{"endpoint", "peer"}},
		{s.cfgPath, []string{"--endpoint", "http://" + addr2}, addr2, [2]string{"peer", "endpoint"}},
	} {
		st, code, out := relayStatus(t, c.path, c.args...)
		ok := code == 1 && !st.Healthy && !st.Database.Reachable && st.Database.Error != "" && len(st.Relays) == 2 &&
			len(st.Problems) > 0 && strings.Contains(st.Problems[0], "the database is unreachable")
		for i, addr := range []string{addr1, addr2} {
			if !ok {
				break
			}
			j := slices.IndexFunc(st.Relays, func(r relayJSON) bool { return r.Address == addr })
			ok = j >= 0 && st.Relays[j].Live != nil && st.Relays[j].Live.Error == "" && st.Relays[j].FoundBy == c.foundBy[i]
		}
		if !ok || strings.Contains(out, "postgres:postgres@") {
			t.Fatalf("status with Postgres stopped, asking %s: exit %d\n%s", c.asked, code, out)
		}
	}
	text, code = runRelay(t, "status", "--config", first)
	if code != 1 || !strings.Contains(text, "database      UNREACHABLE") || !strings.Contains(text, addr2) {
		t.Fatalf("relay status (text) with Postgres stopped: exit %d\n%s", code, text)
	}
	t.Logf("relay status with Postgres stopped:\n%s", text)
}

// TestStatusLeftoverSlot leaves a replication slot of the config's name,
// as an earlier wal run would, beside a poll relay: relay status reports it
// as a problem (exit 1) with what it retains and how to drop it, and is
// healthy once it is dropped.
func TestStatusLeftoverSlot(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{Mode: "poll"})
	ctx := context.Background()
	b, err := os.ReadFile(s.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	slot := regexp.MustCompile(`slot: (relay_test_\d+)`).FindStringSubmatch(string(b))[1]
	if _, err := s.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	dropped := false
	drop := func() {
		if !dropped {
			dropped = true
			if _, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(drop)
	cfg, addr := withListen(t, s.cfgPath)
	startProc(t, ctx, "run", "--config", cfg)
	waitFor(t, func() bool { return readyz(addr) == 200 })
	var st statusJSON
	var code int
	var out string
	waitFor(t, func() bool {
		st, code, out = relayStatus(t, cfg)
		return len(st.Relays) == 1 && st.Partitions != nil && len(st.Partitions.Unowned) == 0
	})
	if code != 1 || st.Slot == nil || st.Slot.Name != slot || st.Slot.Active || len(st.Problems) != 1 ||
		!strings.Contains(st.Problems[0], "left from an earlier wal run") || !strings.Contains(st.Problems[0], "pg_drop_replication_slot('"+slot+"')") {
		t.Fatalf("status with a slot left from a wal run: exit %d\n%s", code, out)
	}
	drop()
	if st, code, out = relayStatus(t, cfg); code != 0 || st.Slot != nil {
		t.Fatalf("status once the slot is dropped: exit %d\n%s", code, out)
	}
}

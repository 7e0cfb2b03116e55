// Package grafana_test checks the Grafana dashboard relay.json against a
// real Prometheus (Debian's prometheus package, which scripts/deps.sh
// installs) scraping two running relays, one per capture mode.
package grafana_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// dashboard is the part of relay.json the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile("relay.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("relay.json: %v", err)
	}
	return d
}

// variables replaces the dashboard's variables as Grafana would for the
// whole time range with every job selected.
var variables = strings.NewReplacer(`$job`, `.*`, `$__rate_interval`, `30s`, `$__range`, `5m`)

// TestDashboard starts a wal relay and a poll relay that move events (one
// of them too large for NATS, so it is dead-lettered), Prometheus scraping
// both every second, and checks that every query of every panel returns
// data: at least one series, whose value may be zero (a counter such as
// relay_events_replay_skipped_total exists from the start and stays 0
// until a restart replays events; a query naming a metric the relay does not
// export returns no series and fails). It also checks the dashboard's
// structure: unique panel ids, every query on the datasource variable, and
// a query for each metric the dashboard must show.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	checkStructure(t, d)
	prom := startPrometheus(t, startRelays(t))
	var failures []string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(2 * time.Second) {
		failures = failures[:0]
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				n, err := prom.query(variables.Replace(tg.Expr))
				if err != nil || n == 0 {
					failures = append(failures, fmt.Sprintf("panel %q query %s: %d series, %v\n  %s", p.Title, tg.RefID, n, err, tg.Expr))
				}
			}
		}
		if len(failures) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
}

func checkStructure(t *testing.T, d dashboard) {
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] || !vars["job"] {
		t.Errorf("variables %v: want datasource and job", vars)
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: want queries on ${datasource}", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			if !strings.Contains(tg.Expr, `job=~"$job"`) {
				t.Errorf("panel %q query %s does not select $job: %s", p.Title, tg.RefID, tg.Expr)
			}
		}
	}
	if queries < 15 {
		t.Errorf("only %d queries", queries)
	}
	// What the dashboard must answer: keeping up, stuck, database safe,
	// and events replayed after restarts.
	var exprs strings.Builder
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	for _, m := range []string{"relay_events_published_by_type_total", "relay_oldest_unpublished_age_seconds",
		"relay_replication_slot_retained_wal_bytes", "relay_replication_slot_wal_keep_size_bytes", "relay_destinations_broken",
		"relay_events_dead_lettered_total", "relay_dead_letters", "relay_publish_retries_total", "relay_publish_batch_duration_seconds_bucket",
		"relay_events_replay_skipped_total", "relay_held_aggregates"} {
		if !strings.Contains(exprs.String(), m+"{") {
			t.Errorf("no panel queries %s", m)
		}
	}
}

// relayBin builds the relay into a temporary directory.
func relayBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/relay").CombinedOutput(); err != nil {
		t.Fatalf("build relay: %v\n%s", err, out)
	}
	return bin
}

// startRelays starts NATS, a wal relay and a poll relay, each on its own
// database, and producers that keep writing to both until the test ends;
// one event is larger than NATS accepts. The server's
// max_slot_wal_keep_size is set, so the slot's limit is a series too. It
// returns the relays' HTTP addresses.
func startRelays(t *testing.T) []string {
	bin := relayBin(t)
	n, err := testenv.StartNATS(testenv.NATSOptions{MaxPayload: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var addrs []string
	for _, mode := range []string{"wal", "poll"} {
		dsn := testenv.NewDB(t)
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		cfg := filepath.Join(t.TempDir(), "relay.yaml")
		yaml := fmt.Sprintf(`postgres:
  url: %s
capture:
  mode: %s
  poll:
    interval: 50ms
sink:
  type: nats
  nats:
    url: %s
    subject: %s.{aggregate_type}
    stream: %s
retry:
  initial: 10ms
  max: 100ms
  max_attempts: 2
http:
  listen: %s
`, dsn, mode, n.URL(), mode, strings.ToUpper(mode), addr)
		if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "init", "--config", cfg).CombinedOutput(); err != nil {
			t.Fatalf("relay init (%s): %v\n%s", mode, err, out)
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if mode == "wal" {
			if _, err := pool.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '1GB'`); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
				t.Fatal(err)
			}
		}
		var logs bytes.Buffer
		relay := exec.CommandContext(ctx, bin, "run", "--config", cfg)
		relay.Stdout, relay.Stderr = &logs, &logs
		if err := relay.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cancel()
			relay.Wait()
			if t.Failed() {
				t.Logf("%s relay log:\n%s", mode, logs.String())
			}
		})
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', 'big', 'too.big', jsonb_build_object('blob', repeat('x', 100000)))`, uuid.NewString()); err != nil {
			t.Fatal(err)
		}
		go produce(ctx, pool)
		addrs = append(addrs, addr)
	}
	return addrs
}

// produce writes an event every 20 ms until ctx ends.
func produce(ctx context.Context, pool *pgxpool.Pool) {
	for i := 0; ctx.Err() == nil; i++ {
		pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', $2, 'order.created', '{}')`, uuid.NewString(), fmt.Sprint(i%10))
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// prometheus is a running Prometheus server.
type prometheus struct{ url string }

// startPrometheus starts Prometheus scraping targets every second as job
// relay, with its data in a temporary directory, and stops it when the test
// ends.
func startPrometheus(t *testing.T, targets []string) *prometheus {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found: run scripts/deps.sh (it installs Debian's prometheus package): %v", err)
	}
	dir := t.TempDir()
	quoted, _ := json.Marshal(targets)
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: relay\n    static_configs:\n      - targets: %s\n", quoted)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := &prometheus{url: "http://" + addr}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get(p.url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 60s:\n%s", logs.String())
		}
	}
}

// query runs an instant query and returns how many series it returned.
func (p *prometheus) query(expr string) (int, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	return len(r.Data.Result), nil
}

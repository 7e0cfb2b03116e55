// Package grafana_test checks the Grafana dashboard relay.json against a
// real Prometheus (Debian's prometheus package, which scripts/deps.sh
// installs) scraping two running relays, one per capture mode, as two
// releases of the same name in two namespaces.
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
	"regexp"
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
// whole time range with every namespace and relay selected.
var variables = strings.NewReplacer(`$namespace`, `.*`, `$relay`, `.*`, `$__rate_interval`, `30s`, `$__range`, `5m`)

// identity is how Prometheus tells one relay from another: the labels the
// chart's ServiceMonitor (relay) and Prometheus Operator (namespace) give
// every target.
type identity struct{ namespace, relay string }

func (id identity) String() string { return id.namespace + "/" + id.relay }

// broken and healthy are the two relays TestDashboard runs: releases of the
// same name in two namespaces, as on a cluster with one relay per team.
// broken dead-letters an event; healthy has nothing to report.
var (
	broken  = identity{"orders", "relay"}
	healthy = identity{"billing", "relay"}
)

// TestDashboard starts a wal relay (broken) and a poll relay (healthy) that
// move events (one of broken's too large for NATS, so it is
// dead-lettered), and Prometheus scraping both every second with the rules
// of deploy/alerts.yaml. It checks that every query of every panel returns
// data, at least one series, whose value may be zero (a counter such as
// relay_events_replay_skipped_total exists from the start and stays 0
// until a restart replays events; a query naming a metric the relay does not
// export returns no series and fails), and one series per relay that
// exports its metrics, each labelled with the relay's namespace and relay:
// no panel merges the two. Then that RelayDeadLetters fires for broken and
// no alert fires or is pending for healthy. It also checks the
// dashboard's structure: unique panel ids, every query on the datasource
// variable and the relay's identity, and a query for each metric the
// dashboard must show.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	checkStructure(t, d)
	prom := startPrometheus(t, startRelays(t))
	var failures []string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(2 * time.Second) {
		failures = failures[:0]
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				if msg := prom.separates(tg.Expr); msg != "" {
					failures = append(failures, fmt.Sprintf("panel %q query %s: %s\n  %s", p.Title, tg.RefID, msg, tg.Expr))
				}
			}
		}
		if msg := prom.alertsOnlyFor(broken, "RelayDeadLetters"); msg != "" {
			failures = append(failures, msg)
		}
		if len(failures) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
}

var seriesName = regexp.MustCompile(`\b(relay_[a-z0-9_]+|up)\{`)

// separates runs a panel's query with every relay selected and returns
// what is wrong with its answer, or "": it must hold a series for each
// relay that exports every metric the query reads, and only series
// labelled with a relay's namespace and relay.
func (p *prometheus) separates(expr string) string {
	want := map[identity]bool{broken: true, healthy: true}
	for _, m := range seriesName.FindAllStringSubmatch(expr, -1) {
		series, err := p.query(fmt.Sprintf(`group by (namespace, relay) (%s{job="relay"})`, m[1]))
		if err != nil {
			return err.Error()
		}
		exports := map[identity]bool{}
		for _, s := range series {
			exports[s.identity()] = true
		}
		for id := range want {
			want[id] = want[id] && exports[id]
		}
	}
	series, err := p.query(variables.Replace(expr))
	if err != nil {
		return err.Error()
	}
	if len(series) == 0 {
		return "no series"
	}
	got := map[identity]bool{}
	for _, s := range series {
		id := s.identity()
		if !want[id] {
			return fmt.Sprintf("a series of %q, want one per relay of %v, each with its namespace and relay labels", id, want)
		}
		got[id] = true
	}
	for id, ok := range want {
		if ok && !got[id] {
			return fmt.Sprintf("no series of %s", id)
		}
	}
	return ""
}

// alertsOnlyFor returns what is wrong with the alerts Prometheus holds, or
// "": alert must fire for id, and no alert may fire or be pending for
// another relay.
func (p *prometheus) alertsOnlyFor(id identity, alert string) string {
	series, err := p.query(`ALERTS`)
	if err != nil {
		return err.Error()
	}
	firing := false
	for _, s := range series {
		switch {
		case s.identity() != id:
			return fmt.Sprintf("alert %s is %s for %s, want alerts for %s alone", s["alertname"], s["alertstate"], s.identity(), id)
		case s["alertname"] == alert && s["alertstate"] == "firing":
			firing = true
		}
	}
	if !firing {
		return fmt.Sprintf("%s does not fire for %s; alerts: %v", alert, id, series)
	}
	return ""
}

func checkStructure(t *testing.T, d dashboard) {
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] || !vars["namespace"] || !vars["relay"] {
		t.Errorf("variables %v: want datasource, namespace and relay", vars)
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
			if strings.Count(tg.Expr, `{`) != strings.Count(tg.Expr, `namespace=~"$namespace", relay=~"$relay"}`) {
				t.Errorf("panel %q query %s does not select $namespace and $relay in every selector: %s", p.Title, tg.RefID, tg.Expr)
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

// startRelays starts NATS, a wal relay (broken) and a poll relay
// (healthy), each on its own database, and producers that keep writing to
// both until the test ends; broken has one event larger than NATS accepts.
// The server's max_slot_wal_keep_size is set, so the slot's limit is a
// series too. It returns the relays' HTTP addresses by identity.
func startRelays(t *testing.T) map[identity]string {
	bin := relayBin(t)
	n, err := testenv.StartNATS(testenv.NATSOptions{MaxPayload: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addrs := map[identity]string{}
	for _, mode := range []string{"wal", "poll"} {
		id := healthy
		if mode == "wal" {
			id = broken
		}
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
		if id == broken {
			if _, err := pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'order', 'big', 'too.big', jsonb_build_object('blob', repeat('x', 100000)))`, uuid.NewString()); err != nil {
				t.Fatal(err)
			}
		}
		go produce(ctx, pool)
		addrs[id] = addr
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
// relay, each with its identity's labels, and evaluating deploy/alerts.yaml
// every second, with its data in a temporary directory, and stops it when
// the test ends.
func startPrometheus(t *testing.T, targets map[identity]string) *prometheus {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found: run scripts/deps.sh (it installs Debian's prometheus package): %v", err)
	}
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join("..", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [%q]\nscrape_configs:\n  - job_name: relay\n    static_configs:\n", rules)
	for id, addr := range targets {
		cfg += fmt.Sprintf("      - targets: [%q]\n        labels: {namespace: %q, relay: %q}\n", addr, id.namespace, id.relay)
	}
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

// labels are one series' labels.
type labels map[string]string

// identity returns the relay a series belongs to.
func (l labels) identity() identity { return identity{l["namespace"], l["relay"]} }

// query runs an instant query and returns the labels of the series it
// returned.
func (p *prometheus) query(expr string) ([]labels, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric labels `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	var out []labels
	for _, s := range r.Data.Result {
		out = append(out, s.Metric)
	}
	return out, nil
}

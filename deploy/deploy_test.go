// Package deploy_test checks the deployment files that cannot be exercised
// here because docker does not run in CI: compose.yaml, the Dockerfile,
// .dockerignore, examples/*.yaml (loaded with the relay's own config loader)
// and the Prometheus rules in deploy/alerts.yaml. It needs no network and no
// docker, and runs in well under a second.
package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/mdcheck"
)

// root is the repository root, where compose.yaml and the Dockerfile live;
// go test runs in the package directory.
const root = ".."

// configPath is where the image expects its config (the Dockerfile's CMD)
// and where compose mounts the example.
const configPath = "/etc/relay/relay.yaml"

// httpPort is the port the Dockerfile exposes, compose publishes and every
// example listens on.
const httpPort = "9090"

// metrics are the metric names deploy/alerts.yaml may use. A rule using a
// name not listed here fails the test, and so does a listed, exported name
// the relay's source no longer defines, so renaming a metric breaks this test
// until the rules follow. pending names are not exported yet; their rules
// never fire until they are. A histogram's rules use its _bucket,
// _sum and _count series.
var metrics = map[string]struct{ pending, histogram bool }{
	"relay_events_captured_total":                   {},
	"relay_events_published_total":                  {},
	"relay_events_dead_lettered_total":              {},
	"relay_publish_retries_total":                   {},
	"relay_publish_errors_total":                    {},
	"relay_events_archived_total":                   {},
	"relay_events_in_flight":                        {},
	"relay_sink_ready":                              {},
	"relay_capture_ready":                           {},
	"relay_oldest_unpublished_age_seconds":          {},
	"relay_commit_to_ack_seconds":                   {histogram: true},
	"relay_replication_slot_lag_bytes":              {},
	"relay_replication_slot_safe_wal_fraction":      {},
	"relay_replication_slot_active":                 {},
	"relay_replication_slot_stalled_seconds":        {},
	"relay_replication_slot_wal_status":             {},
	"relay_replication_slot_stall_recoveries_total": {},
	"relay_destinations_broken":                     {},
	"relay_destination_broken_seconds":              {},
	"relay_held_max_age_seconds":                    {},
	"relay_held_aggregates":                         {},
	"relay_dead_letters":                            {},
	"relay_capture_leader":                          {},
}

// knownMetric reports whether a series name in an expression is one of
// metrics, and which.
func knownMetric(series string) (string, bool) {
	if _, ok := metrics[series]; ok {
		return series, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok && metrics[base].histogram {
			return base, true
		}
	}
	return "", false
}

// ---------------------------------------------------------------- compose

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string         `yaml:"image"`
	Build       any            `yaml:"build"`
	Command     any            `yaml:"command"`
	Environment map[string]any `yaml:"environment"`
	Volumes     []string       `yaml:"volumes"`
	Ports       []string       `yaml:"ports"`
	ExtraHosts  []string       `yaml:"extra_hosts"`
	Healthcheck *struct {
		Test    any  `yaml:"test"`
		Disable bool `yaml:"disable"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Restart  string   `yaml:"restart"`
	Profiles []string `yaml:"profiles"`
	Networks map[string]struct {
		Aliases []string `yaml:"aliases"`
	} `yaml:"networks"`
}

// loadCompose parses compose.yaml, resolving anchors and merge keys.
func loadCompose(t *testing.T) composeFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("compose.yaml: no services")
	}
	return c
}

var composeVar = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}`)

// interpolate expands compose variables the way `docker compose` does with an
// empty environment: ${VAR:-default} and ${VAR-default} become default,
// ${VAR} becomes empty and $$ a literal $.
func interpolate(s string) string {
	return composeVar.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		return composeVar.FindStringSubmatch(m)[2]
	})
}

// words returns a compose command or healthcheck test as a list.
func words(v any) []string {
	switch v := v.(type) {
	case string:
		return strings.Fields(v)
	case []any:
		var out []string
		for _, w := range v {
			out = append(out, fmt.Sprint(w))
		}
		return out
	}
	return nil
}

// environment returns a service's environment after interpolation.
func environment(s composeService) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		env[k] = interpolate(fmt.Sprint(v))
	}
	return env
}

type mount struct{ source, target, mode string }

// mounts returns a service's short-syntax volumes after interpolation.
func mounts(s composeService) []mount {
	var out []mount
	for _, v := range s.Volumes {
		parts := strings.Split(interpolate(v), ":")
		m := mount{source: parts[0]}
		if len(parts) > 1 {
			m.target = parts[1]
		}
		if len(parts) > 2 {
			m.mode = parts[2]
		}
		out = append(out, m)
	}
	return out
}

// configMount returns the example file a relay service mounts as its config.
func configMount(t *testing.T, name string, s composeService) string {
	t.Helper()
	for _, m := range mounts(s) {
		if m.target != configPath {
			continue
		}
		if m.mode != "ro" {
			t.Errorf("%s: the config mount %s should be read-only (:ro)", name, m.source)
		}
		rel := filepath.Clean(m.source)
		if dir, _ := filepath.Split(rel); dir != "examples/" || filepath.Ext(rel) != ".yaml" {
			t.Errorf("%s: the config mount %s is not a file in examples/", name, m.source)
		}
		return rel
	}
	t.Errorf("%s: nothing is mounted at %s", name, configPath)
	return ""
}

// sinkProfiles maps each compose profile that runs a relay to the broker
// service it starts ("" for the webhook, whose receiver compose does not
// run). The profile's relay services are relay-<profile> and
// relay-init-<profile>.
var sinkProfiles = map[string]string{"nats": "nats", "kafka": "kafka", "pubsub": "pubsub", "rabbitmq": "rabbitmq", "redis": "redis", "sqs": "sqs", "webhook": ""}

// relayServices returns the names of the long-running relay services.
func relayServices() []string {
	var names []string
	for _, p := range slices.Sorted(maps.Keys(sinkProfiles)) {
		names = append(names, "relay-"+p)
	}
	return names
}

func TestCompose(t *testing.T) {
	c := loadCompose(t)
	docker := loadDockerfile(t)

	for _, name := range []string{"postgres", "kafka", "nats", "pubsub", "rabbitmq", "redis", "sqs"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("compose.yaml: service %q is missing", name)
		}
	}
	for p := range sinkProfiles {
		for _, name := range []string{"relay-" + p, "relay-init-" + p} {
			if _, ok := c.Services[name]; !ok {
				t.Errorf("compose.yaml: service %q is missing", name)
			}
		}
	}
	// Postgres runs with every profile; a broker only with its own, so that
	// `docker compose --profile nats up` never waits for Kafka.
	if pg := c.Services["postgres"]; len(pg.Profiles) > 0 {
		t.Errorf("postgres: runs only with profiles %q; it should run with every profile", pg.Profiles)
	}
	for p, broker := range sinkProfiles {
		if s, ok := c.Services[broker]; ok && broker != "" && !slices.Equal(s.Profiles, []string{p}) {
			t.Errorf("%s: profiles %q, want [%s]", broker, s.Profiles, p)
		}
	}

	for _, name := range slices.Sorted(maps.Keys(c.Services)) {
		s := c.Services[name]
		if s.Image == "" && s.Build == nil {
			t.Errorf("%s: neither image nor build", name)
		}
		// Healthchecks: every long-running service has one, so depends_on
		// can wait for it. relay-init runs once; the relay image is
		// distroless, with nothing to run a check with (see the Dockerfile).
		switch {
		case strings.HasPrefix(name, "relay-init-"):
			if s.Restart != "no" {
				t.Errorf("%s is one-shot and needs restart: \"no\", got %q", name, s.Restart)
			}
		case slices.Contains(relayServices(), name) && s.Healthcheck == nil:
			if !docker.shellless() {
				t.Errorf("relay: no healthcheck, which is excused only while the image has no shell (distroless or scratch); the final image is %s", docker.finalBase())
			}
		case s.Healthcheck == nil || s.Healthcheck.Disable:
			t.Errorf("%s: no healthcheck", name)
		default:
			test := words(s.Healthcheck.Test)
			if len(test) < 2 || (test[0] != "CMD" && test[0] != "CMD-SHELL") {
				t.Errorf("%s: healthcheck test %q should be [CMD ...] or [CMD-SHELL ...]", name, test)
			}
		}
		// Every service waited for must be able to become healthy, every
		// bind-mounted file must exist, and named volumes must be declared.
		for dep, d := range s.DependsOn {
			target, ok := c.Services[dep]
			switch {
			case !ok:
				t.Errorf("%s: depends_on unknown service %q", name, dep)
			case d.Condition == "service_healthy" && target.Healthcheck == nil:
				t.Errorf("%s: waits for %s to be healthy, which has no healthcheck", name, dep)
			case len(target.Profiles) > 0 && !slices.ContainsFunc(s.Profiles, func(p string) bool { return slices.Contains(target.Profiles, p) }):
				t.Errorf("%s: depends on %s, which does not run with every profile %s runs with", name, dep, name)
			}
		}
		for _, m := range mounts(s) {
			if strings.HasPrefix(m.source, ".") || strings.HasPrefix(m.source, "/") {
				if _, err := os.Stat(filepath.Join(root, m.source)); err != nil {
					t.Errorf("%s: mounts %s, which does not exist", name, m.source)
				}
			} else if _, ok := c.Volumes[m.source]; !ok {
				t.Errorf("%s: named volume %q is not declared under volumes", name, m.source)
			}
		}
	}

	if pg, ok := c.Services["postgres"]; ok {
		cmd := strings.Join(words(pg.Command), " ")
		if !strings.Contains(cmd, "wal_level=logical") {
			t.Errorf("postgres must run with -c wal_level=logical for WAL capture, command is %q", cmd)
		}
		if !strings.Contains(cmd, "max_replication_slots=") || !strings.Contains(cmd, "max_wal_senders=") {
			t.Errorf("postgres should set max_replication_slots and max_wal_senders, command is %q", cmd)
		}
	}
	if nats, ok := c.Services["nats"]; ok {
		if cmd := words(nats.Command); !slices.Contains(cmd, "-js") && !slices.Contains(cmd, "--jetstream") {
			t.Errorf("nats must run with JetStream (-js), command is %q", cmd)
		}
	}

	for p, broker := range sinkProfiles {
		relayName, initName := "relay-"+p, "relay-init-"+p
		for _, name := range []string{relayName, initName} {
			s, ok := c.Services[name]
			if !ok {
				continue
			}
			if s.Build == nil {
				t.Errorf("%s: should be built from the Dockerfile (build: .)", name)
			}
			if !slices.Equal(s.Profiles, []string{p}) {
				t.Errorf("%s: profiles %q, want [%s]", name, s.Profiles, p)
			}
			deps := []string{"postgres"}
			if broker != "" {
				deps = append(deps, broker)
			}
			for _, dep := range deps {
				if d, ok := s.DependsOn[dep]; !ok || d.Condition != "service_healthy" {
					t.Errorf("%s: needs depends_on %s with condition service_healthy", name, dep)
				}
			}
			sub := "run"
			if name == initName {
				sub = "init"
			}
			if cmd, want := words(s.Command), []string{sub, "--config", configPath}; !slices.Equal(cmd, want) {
				t.Errorf("%s: command %q, want %q", name, cmd, want)
			}
			if file := configMount(t, name, s); file != "" {
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s: mounts %s, which is not an example: %v", name, file, err)
				} else if prefix, _, _ := strings.Cut(strings.TrimSuffix(filepath.Base(file), ".yaml"), "-"); prefix != p {
					t.Errorf("%s: mounts %s, an example for another sink (TestExamples checks the names)", name, file)
				}
			}
		}
		relay, ok := c.Services[relayName]
		if !ok {
			continue
		}
		if d, ok := relay.DependsOn[initName]; !ok || d.Condition != "service_completed_successfully" {
			t.Errorf("%s: needs depends_on %s with condition service_completed_successfully", relayName, initName)
		}
		if !slices.Contains(relay.Ports, "127.0.0.1:"+httpPort+":"+httpPort) {
			t.Errorf("%s: publishes %q, want the container's port %s on the host's loopback only (/metrics, /healthz, /readyz have no authentication)",
				relayName, relay.Ports, httpPort)
		}
		if init, ok := c.Services[initName]; ok {
			if a, b := configMount(t, relayName, relay), configMount(t, initName, init); a != b {
				t.Errorf("%s mounts %s but %s %s: init must prepare what run uses", relayName, a, initName, b)
			}
			if !maps.Equal(environment(relay), environment(init)) {
				t.Errorf("%s and %s have different environments", relayName, initName)
			}
		}
		if !maps.Equal(environment(relay), environment(c.Services[relayServices()[0]])) {
			t.Errorf("%s and %s have different environments", relayName, relayServices()[0])
		}
	}
	if cmd := docker.cmd(); !slices.Equal(cmd, []string{"run", "--config", configPath}) {
		t.Errorf("Dockerfile: CMD %q, want [run --config %s]", cmd, configPath)
	}
}

// TestPrometheusConfig checks deploy/prometheus.yml, which compose's
// monitoring profile runs: it loads the mounted rules and scrapes the relay
// as the job the rules expect.
func TestPrometheusConfig(t *testing.T) {
	c := loadCompose(t)
	prom, ok := c.Services["prometheus"]
	if !ok {
		t.Skip("compose.yaml has no prometheus service")
	}
	var cfgFile, rulesTarget string
	for _, m := range mounts(prom) {
		switch filepath.Clean(m.source) {
		case "deploy/alerts.yaml":
			rulesTarget = m.target
		case "deploy/prometheus.yml":
			cfgFile = filepath.Join(root, m.source)
		}
	}
	if cfgFile == "" || rulesTarget == "" {
		t.Fatalf("prometheus: should mount deploy/prometheus.yml and deploy/alerts.yaml, mounts %q", prom.Volumes)
	}
	data, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string          `yaml:"targets"`
				Labels  map[string]string `yaml:"labels"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(data, &p); err != nil {
		t.Fatalf("%s: %v", cfgFile, err)
	}
	if !slices.Contains(p.RuleFiles, rulesTarget) {
		t.Errorf("prometheus.yml: rule_files %q does not load the mounted rules %s", p.RuleFiles, rulesTarget)
	}
	found := false
	for _, sc := range p.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if sc.JobName == "relay" && slices.Contains(st.Targets, "relay:"+httpPort) {
				found = true
				if st.Labels["namespace"] == "" || st.Labels["relay"] == "" {
					t.Errorf("prometheus.yml: relay:%s has labels %v; the alerts and the dashboard tell relays apart by namespace and relay", httpPort, st.Labels)
				}
			}
		}
	}
	if !found {
		t.Errorf("prometheus.yml: no job \"relay\" scraping relay:%s, which alerts.yaml's up{job=\"relay\"} expects", httpPort)
	}
	for _, name := range relayServices() {
		if !slices.Contains(c.Services[name].Networks["default"].Aliases, "relay") {
			t.Errorf("%s: needs the network alias relay on the default network, the host prometheus.yml scrapes", name)
		}
	}
}

// -------------------------------------------------------------- examples

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}\n]*)?\}`)

// stripComments removes YAML comments: from a # at the start of a line or
// after a blank to the end of the line. Good enough for the examples, which
// have no # inside values.
func stripComments(s string) string {
	lines := strings.Split(s, "\n")
	for i, line := range lines {
		for j := 0; j < len(line); j++ {
			if line[j] == '#' && (j == 0 || line[j-1] == ' ' || line[j-1] == '\t') {
				lines[i] = line[:j]
				break
			}
		}
	}
	return strings.Join(lines, "\n")
}

// TestExamples loads every examples/*.yaml with config.Load, in the
// environment compose.yaml gives the relay, and checks that it fits the
// compose stack: hostnames are compose services, /metrics is reachable from
// outside the container, and secrets come from the environment.
func TestExamples(t *testing.T) {
	c := loadCompose(t)
	relayEnv := environment(c.Services[relayServices()[0]])
	hosts := map[string]bool{}
	for name := range c.Services {
		hosts[name] = true
	}
	for _, h := range c.Services[relayServices()[0]].ExtraHosts {
		name, _, _ := strings.Cut(h, ":")
		hosts[name] = true
	}

	files, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.yaml")
	}
	sinks, modes := map[string]bool{}, map[string]bool{}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			// Environment: what compose passes to the relay; a variable
			// compose does not set must have a default in the example.
			// References inside comments get a sample value.
			for _, m := range envRef.FindAllStringSubmatch(string(data), -1) {
				t.Setenv(m[1], "sample-"+strings.ToLower(m[1]))
			}
			for _, m := range envRef.FindAllStringSubmatch(stripComments(string(data)), -1) {
				name, hasDefault := m[1], m[2] != ""
				switch v, ok := relayEnv[name]; {
				case ok:
					t.Setenv(name, v)
				case hasDefault:
					t.Setenv(name, "")
				default:
					t.Errorf("references ${%s}, which compose.yaml does not give the relay and which has no default", name)
				}
			}

			cfg, err := config.Load(file)
			if err != nil {
				t.Fatalf("config.Load: %v", err)
			}
			base := strings.TrimSuffix(filepath.Base(file), ".yaml")
			if prefix, _, _ := strings.Cut(base, "-"); prefix != cfg.Sink.Type {
				t.Errorf("sink.type is %s; name the file %s.yaml or %s-<variant>.yaml", cfg.Sink.Type, cfg.Sink.Type, cfg.Sink.Type)
			}
			sinks[cfg.Sink.Type] = true
			modes[cfg.Capture.Mode] = true

			if !regexp.MustCompile(`(?m)^\s*url:\s*postgres(ql)?://\S*:\$\{[A-Za-z_][A-Za-z0-9_]*\}@`).Match(data) {
				t.Error("postgres.url should take its password from ${VAR}, never the file")
			}
			host, port, err := net.SplitHostPort(cfg.HTTP.Listen)
			switch {
			case err != nil:
				t.Errorf("http.listen %q: %v (the container needs /metrics and /healthz)", cfg.HTTP.Listen, err)
			case port != httpPort:
				t.Errorf("http.listen port %s, want %s (the Dockerfile's EXPOSE and compose's ports)", port, httpPort)
			case host != "" && host != "0.0.0.0" && host != "::":
				t.Errorf("http.listen %q is unreachable from outside the container; listen on 0.0.0.0", cfg.HTTP.Listen)
			}
			t.Setenv("RELAY_HTTP_LISTEN", "")
			if alone, err := config.Load(file); err != nil {
				t.Errorf("without compose's RELAY_HTTP_LISTEN: %v", err)
			} else if !strings.HasPrefix(alone.HTTP.Listen, "127.0.0.1:") {
				t.Errorf("without compose's RELAY_HTTP_LISTEN, http.listen is %q; bind loopback by default: /metrics has no authentication",
					alone.HTTP.Listen)
			}

			checkHost := func(key, raw string) {
				t.Helper()
				h := raw
				if u, err := url.Parse(raw); err == nil && u.Host != "" {
					h = u.Hostname()
				} else if hh, _, err := net.SplitHostPort(raw); err == nil {
					h = hh
				}
				if !hosts[h] {
					t.Errorf("%s %q: host %q is not a compose service", key, raw, h)
				}
			}
			checkHost("postgres.url", cfg.Postgres.URL)
			switch cfg.Sink.Type {
			case "nats":
				for _, u := range strings.Split(cfg.Sink.NATS.URL, ",") {
					checkHost("sink.nats.url", strings.TrimSpace(u))
				}
			case "kafka":
				for _, b := range cfg.Sink.Kafka.Brokers {
					checkHost("sink.kafka.brokers", b)
				}
			case "rabbitmq":
				checkHost("sink.rabbitmq.url", cfg.Sink.RabbitMQ.URL)
			case "sqs":
				checkHost("sink.sqs.endpoint", cfg.Sink.SQS.Endpoint)
				if cfg.Sink.SQS.QueueURL != "" {
					checkHost("sink.sqs.queue_url", cfg.Sink.SQS.QueueURL)
				}
			case "redis":
				checkHost("sink.redis.url", cfg.Sink.Redis.URL)
			case "pubsub":
				if cfg.Sink.PubSub.Endpoint != "" {
					checkHost("sink.pubsub.endpoint", cfg.Sink.PubSub.Endpoint)
				}
				checkHost("PUBSUB_EMULATOR_HOST", relayEnv["PUBSUB_EMULATOR_HOST"])
			case "webhook":
				checkHost("sink.webhook.url", strings.NewReplacer("{", "", "}", "").Replace(cfg.Sink.Webhook.URL))
			}
		})
	}
	for _, s := range []string{"kafka", "nats", "pubsub", "rabbitmq", "redis", "sqs", "webhook"} {
		if !sinks[s] {
			t.Errorf("no example for the %s sink", s)
		}
	}
	for _, m := range []string{"poll", "wal"} {
		if !modes[m] {
			t.Errorf("no example with capture.mode %s", m)
		}
	}
}

// TestExampleErrorsAreCaught makes sure the example check has teeth: an
// unknown key in a copy of an example is an error from the same loader.
func TestExampleErrorsAreCaught(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "examples", "nats.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, append(data, []byte("\nsink_typo: 1\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.Load(bad)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("config.Load of an example with an unknown key: %v, want a *config.Error", err)
	}
}

// ---------------------------------------------------------------- alerts

type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

var (
	promDuration = regexp.MustCompile(`^([0-9]+(ms|[smhdwy]))+$`)
	alertName    = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	quoted       = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'|` + "`[^`]*`")
	byClause     = regexp.MustCompile(`\b(?:by|on)\s*\(([^)]*)\)`)
	metricName   = regexp.MustCompile(`\b(relay_[a-z0-9_]+|up)\b`)
	runbook      = regexp.MustCompile(`^https://github\.com/outboxrelay/relay/blob/main/docs/runbooks\.md#([a-z0-9-]+)$`)
)

// templateFuncs stands in for Prometheus' template functions, so
// annotations parse and execute as Prometheus would run them.
var templateFuncs = template.FuncMap{}

func init() {
	for _, name := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp", "title", "toUpper", "toLower", "first", "label", "value", "query", "reReplaceAll", "match", "args", "safeHtml", "stripPort", "pathPrefix", "externalURL", "graphLink", "tableLink", "sortByLabel", "strvalue", "parseDuration", "toTime"} {
		templateFuncs[name] = func(args ...any) string { return fmt.Sprint(args...) }
	}
}

// templateHeader is what Prometheus prepends to every annotation template.
const templateHeader = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

// balanced reports whether the brackets of a PromQL expression (strings
// removed) match.
func balanced(expr string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range quoted.ReplaceAllString(expr, `""`) {
		switch r {
		case '(', '[', '{':
			stack = append(stack, r)
		case ')', ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0
}

func TestAlerts(t *testing.T) {
	path := filepath.Join(root, "deploy", "alerts.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalWithOptions(data, &rf, yaml.Strict()); err != nil {
		t.Fatalf("alerts.yaml (strict: unknown keys are errors): %v", err)
	}
	if len(rf.Groups) == 0 {
		t.Fatal("alerts.yaml: no groups")
	}

	anchors, err := mdcheck.Anchors(filepath.Join(root, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	groups, alerts, used := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, g := range rf.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group name %q is empty or repeated", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for i, r := range g.Rules {
			id := fmt.Sprintf("%s/%d %s", g.Name, i, r.Alert)
			switch {
			case r.Record != "":
				t.Errorf("%s: recording rules are not expected in alerts.yaml", id)
				continue
			case !alertName.MatchString(r.Alert):
				t.Errorf("%s: alert name should be CamelCase", id)
			case alerts[r.Alert]:
				t.Errorf("%s: alert name repeated", id)
			}
			alerts[r.Alert] = true

			expr := strings.TrimSpace(r.Expr)
			if expr == "" {
				t.Errorf("%s: no expr", id)
			} else if !balanced(expr) {
				t.Errorf("%s: unbalanced brackets in expr %q", id, expr)
			}
			if r.For != "" && !promDuration.MatchString(r.For) {
				t.Errorf("%s: for %q is not a Prometheus duration", id, r.For)
			}
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" && sev != "info" {
				t.Errorf("%s: labels.severity %q, want warning, critical or info", id, sev)
			}
			for _, key := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[key]) == "" {
					t.Errorf("%s: no annotations.%s", id, key)
				}
			}
			// Each alert has its own runbook section, the alert's name as
			// its heading.
			if m := runbook.FindStringSubmatch(r.Annotations["runbook_url"]); m == nil || m[1] != strings.ToLower(r.Alert) {
				t.Errorf("%s: annotations.runbook_url %q should point to docs/runbooks.md#%s", id, r.Annotations["runbook_url"], strings.ToLower(r.Alert))
			} else if !anchors[m[1]] {
				t.Errorf("%s: docs/runbooks.md has no section #%s", id, m[1])
			}

			// Two relays must never merge: every aggregation keeps the
			// relay's identity.
			for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
				labels := strings.Split(strings.ReplaceAll(m[1], " ", ""), ",")
				if !slices.Contains(labels, "namespace") || !slices.Contains(labels, "relay") {
					t.Errorf("%s: %q drops namespace or relay, which identify a relay", id, m[0])
				}
			}

			names := metricName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1)
			if len(names) == 0 {
				t.Errorf("%s: expr uses no known metric: %q", id, expr)
			}
			for _, n := range names {
				base, ok := knownMetric(n)
				if n == "up" {
					base, ok = n, true
				}
				if !ok {
					t.Errorf("%s: expr uses %s, which the relay does not export (known: %s)", id, n, strings.Join(slices.Sorted(maps.Keys(metrics)), ", "))
				}
				used[base] = true
			}
			for key, text := range r.Annotations {
				checkTemplate(t, id+" annotations."+key, text)
			}
		}
	}
	if !alerts["RelayDestinationBroken"] {
		t.Error("no RelayDestinationBroken alert: a destination failing for long must be reported")
	}
	for _, want := range []string{"relay_dead_letters", "relay_oldest_unpublished_age_seconds", "relay_replication_slot_lag_bytes", "relay_sink_ready", "up", "relay_publish_retries_total", "relay_destination_broken_seconds"} {
		if !used[want] {
			t.Errorf("no alert uses %s", want)
		}
	}
}

// checkTemplate parses and runs an annotation like Prometheus does.
func checkTemplate(t *testing.T, id, text string) {
	t.Helper()
	tmpl, err := template.New(id).Funcs(templateFuncs).Option("missingkey=zero").Parse(templateHeader + text)
	if err != nil {
		t.Errorf("%s: %v", id, err)
		return
	}
	data := struct {
		Labels, ExternalLabels map[string]string
		ExternalURL            string
		Value                  float64
	}{Labels: map[string]string{"job": "relay", "namespace": "orders", "relay": "relay", "instance": "relay:9090"}, Value: 1}
	if err := tmpl.Execute(new(strings.Builder), data); err != nil {
		t.Errorf("%s: %v", id, err)
	}
}

// TestAlertMetricsExist checks the metric list against the relay's source:
// each exported name in it must still be defined somewhere outside tests, as
// "name" with the relay_ namespace or as "relay_name".
func TestAlertMetricsExist(t *testing.T) {
	var src strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "deploy", "examples", "testdata", "vendor", "docs":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			src.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	text := src.String()
	for _, name := range slices.Sorted(maps.Keys(metrics)) {
		short := strings.TrimPrefix(name, "relay_")
		defined := strings.Contains(text, `"`+short+`"`) || strings.Contains(text, `"`+name+`"`)
		switch {
		case metrics[name].pending && defined:
			t.Logf("%s is exported now: mark it no longer pending", name)
		case metrics[name].pending:
			t.Logf("%s is not exported yet: its alerts never fire", name)
		case !defined:
			t.Errorf("%s is in the alerts' metric list but the relay's source no longer defines it: renamed? update deploy/alerts.yaml and this list", name)
		}
	}
}

// ------------------------------------------------------------ Dockerfile

type instruction struct {
	cmd, args string
}

type dockerfile struct {
	stages [][]instruction // each starts with its FROM
}

// loadDockerfile reads the Dockerfile into stages of instructions, with
// continuation lines joined and comments dropped.
func loadDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var d dockerfile
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			d.stages = append(d.stages, nil)
		}
		if len(d.stages) == 0 {
			t.Fatalf("Dockerfile: %s before the first FROM", in.cmd)
		}
		d.stages[len(d.stages)-1] = append(d.stages[len(d.stages)-1], in)
	}
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	if len(d.stages) == 0 {
		t.Fatal("Dockerfile: no FROM")
	}
	return d
}

func (d dockerfile) final() []instruction { return d.stages[len(d.stages)-1] }

// finalBase is the image the final stage starts from.
func (d dockerfile) finalBase() string {
	f := strings.Fields(d.final()[0].args)
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		f = f[1:]
	}
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// shellless reports whether the final image has no shell to run a
// healthcheck with.
func (d dockerfile) shellless() bool {
	b := d.finalBase()
	return b == "scratch" || strings.HasPrefix(b, "gcr.io/distroless/static") || strings.HasPrefix(b, "gcr.io/distroless/base")
}

// last returns the arguments of the final stage's last cmd instruction.
func (d dockerfile) last(cmd string) string {
	var args string
	for _, in := range d.final() {
		if in.cmd == cmd {
			args = in.args
		}
	}
	return args
}

// cmd returns the final stage's CMD in exec form.
func (d dockerfile) cmd() []string {
	var cmd []string
	json.Unmarshal([]byte(d.last("CMD")), &cmd)
	return cmd
}

func TestDockerfile(t *testing.T) {
	d := loadDockerfile(t)
	if len(d.stages) < 2 {
		t.Fatalf("Dockerfile: %d stage(s), want a builder stage and a final one", len(d.stages))
	}
	var builder []instruction
	for _, st := range d.stages[:len(d.stages)-1] {
		if f := strings.Fields(strings.ToLower(st[0].args)); len(f) >= 3 && f[len(f)-2] == "as" && f[len(f)-1] == "builder" {
			builder = st
		}
	}
	if builder == nil {
		t.Fatal("Dockerfile: no stage named builder (FROM golang:... AS builder)")
	}
	if !strings.Contains(builder[0].args, "golang:1.") {
		t.Errorf("Dockerfile: builder stage from %q, want golang:1.x", builder[0].args)
	}
	var build string
	for _, in := range builder {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w `, "buildinfo.version=${VERSION}", "buildinfo.commit=${COMMIT}", "./cmd/relay"} {
		if !strings.Contains(build, want) {
			t.Errorf("Dockerfile: the go build step %q lacks %s", build, want)
		}
	}

	base := d.finalBase()
	user := d.last("USER")
	switch {
	case strings.HasPrefix(base, "gcr.io/distroless/") && strings.HasSuffix(base, ":nonroot"):
	case user != "" && !strings.HasPrefix(user, "root") && !strings.HasPrefix(user, "0"):
	default:
		t.Errorf("Dockerfile: the final image %s runs as root; use a :nonroot distroless image or a non-root USER", base)
	}
	if strings.HasPrefix(user, "root") || user == "0" || strings.HasPrefix(user, "0:") {
		t.Errorf("Dockerfile: USER %s", user)
	}
	if !d.shellless() && !strings.HasPrefix(base, "gcr.io/distroless/") {
		t.Errorf("Dockerfile: final image %s is not minimal (distroless or scratch)", base)
	}
	if base == "scratch" && !strings.Contains(fmt.Sprint(d.final()), "ca-certificates") {
		t.Error("Dockerfile: a scratch image needs CA certificates copied in for TLS to brokers")
	}
	if !slices.ContainsFunc(d.final(), func(in instruction) bool {
		return in.cmd == "COPY" && strings.Contains(in.args, "--from=builder")
	}) {
		t.Error("Dockerfile: the final stage copies nothing from the builder")
	}
	var entry []string
	if err := json.Unmarshal([]byte(d.last("ENTRYPOINT")), &entry); err != nil || len(entry) != 1 || entry[0] != "/relay" {
		t.Errorf("Dockerfile: ENTRYPOINT %q, want exec form [\"/relay\"] (so SIGTERM reaches the relay)", d.last("ENTRYPOINT"))
	}
	if cmd := d.cmd(); !slices.Equal(cmd, []string{"run", "--config", configPath}) {
		t.Errorf("Dockerfile: CMD %q, want exec form [\"run\", \"--config\", %q]", d.last("CMD"), configPath)
	}
	if !slices.Contains(strings.Fields(d.last("EXPOSE")), httpPort) {
		t.Errorf("Dockerfile: EXPOSE %q, want %s", d.last("EXPOSE"), httpPort)
	}
	if env := d.last("ENV"); env != "GODEBUG=schedtrace=2147483647" {
		t.Errorf("Dockerfile: ENV %q, want GODEBUG=schedtrace=2147483647 (docs/operations.md, the runtime's monitor thread: relay run no longer sets it itself)", env)
	}
	if hc := d.last("HEALTHCHECK"); hc != "" && d.shellless() && !strings.HasPrefix(strings.ToUpper(hc), "NONE") {
		t.Errorf("Dockerfile: HEALTHCHECK %q cannot run in %s, which has no shell or tools", hc, base)
	}
}

func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/"))
		}
	}
	if !slices.Contains(patterns, ".git") {
		t.Error(".dockerignore should exclude .git")
	}
	// What the build needs must stay in the context.
	for _, need := range []string{"go.mod", "go.sum", "cmd", "cmd/relay", "config", "internal"} {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, need); ok || p == "*" || p == "**" {
				t.Errorf(".dockerignore pattern %q excludes %s, which the build needs", p, need)
			}
		}
	}
}

// TestNoDurationsInComposeWithoutUnits guards a common compose mistake: a
// healthcheck interval or timeout without a unit is rejected by docker.
func TestNoDurationsInComposeWithoutUnits(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Services map[string]struct {
			StopGracePeriod any            `yaml:"stop_grace_period"`
			Healthcheck     map[string]any `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for name, s := range raw.Services {
		check := func(key string, v any) {
			if s, ok := v.(string); !ok {
				t.Errorf("%s: %s %v is not a duration string like 10s", name, key, v)
			} else if _, err := time.ParseDuration(s); err != nil {
				t.Errorf("%s: %s %q: %v", name, key, s, err)
			}
		}
		for _, key := range []string{"interval", "timeout", "start_period", "start_interval"} {
			if v, ok := s.Healthcheck[key]; ok {
				check("healthcheck."+key, v)
			}
		}
		if s.StopGracePeriod != nil {
			check("stop_grace_period", s.StopGracePeriod)
		}
	}
}

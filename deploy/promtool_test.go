package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// promtool returns the path of Prometheus's promtool (Debian's prometheus
// package, which scripts/deps.sh installs), failing the test without it.
func promtool(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: run scripts/deps.sh (it installs Debian's prometheus package): %v", err)
	}
	return bin
}

// TestPromtoolRules runs `promtool check rules` on alerts.yaml and `promtool
// test rules` on alerts_test.yaml, whose cases must fire every alert once
// and leave it silent once. The unit tests run against the rules without
// their annotations, which promtool would compare as rendered text; their
// templates are checked by TestAlertRules.
func TestPromtoolRules(t *testing.T) {
	bin := promtool(t)
	if out, err := exec.Command(bin, "check", "rules", "alerts.yaml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules alerts.yaml: %v\n%s", err, out)
	}
	data, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string           `yaml:"name"`
			Rules []map[string]any `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			delete(r, "annotations")
			names = append(names, r["alert"].(string))
		}
	}
	checkAlertCases(t, names)
	dir := t.TempDir()
	stripped, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"alerts.yaml": stripped, "alerts_test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(bin, "test", "rules", filepath.Join(dir, "alerts_test.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules alerts_test.yaml: %v\n%s", err, out)
	} else {
		t.Logf("%s", strings.TrimSpace(string(out)))
	}
}

// checkAlertCases fails unless alerts_test.yaml has, for every alert in
// names, a check where it fires and one where it does not.
func checkAlertCases(t *testing.T, names []string) {
	t.Helper()
	data, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Tests []struct {
			Checks []struct {
				Alert  string `yaml:"alertname"`
				Alerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range file.Tests {
		for _, c := range tc.Checks {
			if !slices.Contains(names, c.Alert) {
				t.Errorf("alerts_test.yaml checks %s, which alerts.yaml does not define", c.Alert)
			}
			fires[c.Alert] = fires[c.Alert] || len(c.Alerts) > 0
			silent[c.Alert] = silent[c.Alert] || len(c.Alerts) == 0
		}
	}
	for _, n := range names {
		if !fires[n] || !silent[n] {
			t.Errorf("alerts_test.yaml should check %s both firing (%v) and not firing (%v)", n, fires[n], silent[n])
		}
	}
}

package helm_test

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/embedded"
)

// HelmVersion is the helm CLI scripts/deps.sh installs (go install
// helm.sh/helm/v3/cmd/helm@HelmVersion) into helmDir of the test cache.
const HelmVersion = "v3.22.0"

// chart is the chart's directory.
const chart = "relay"

// peakRSS is the relay's measured peak RSS of a 1,000,000-event drain
// (docs/benchmarks.md, docs/operations.md): the default memory request
// must cover it.
var peakRSS = resource.MustParse("95M")

// helm returns the path of the helm CLI, failing the test when
// scripts/deps.sh has not installed it.
func helm(t *testing.T) string {
	t.Helper()
	cache, err := embedded.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(cache, "bin-helm-"+HelmVersion, "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm %s is not installed in %s: run scripts/deps.sh (%v)", HelmVersion, filepath.Dir(bin), err)
	}
	return bin
}

// runHelm runs helm with args and returns its stdout, or its stderr as the
// error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valuesFiles are the chart's example values files, and "" for the
// defaults.
func valuesFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(chart, "examples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	return append([]string{""}, files...)
}

// rendered is what one `helm template` produced, decoded strictly.
type rendered struct {
	deployment *appsv1.Deployment
	configMap  *corev1.ConfigMap
	secret     *corev1.Secret
	service    *corev1.Service
	account    *corev1.ServiceAccount
	pdb        *policyv1.PodDisruptionBudget
	monitor    *monitoringv1.ServiceMonitor
	rule       *monitoringv1.PrometheusRule
	// The init Job's hook objects (init.enabled).
	job        *batchv1.Job
	initConfig *corev1.ConfigMap
	initSecret *corev1.Secret
	policy     *networkingv1.NetworkPolicy
}

// render runs helm template with the values file (none for "") and
// decodes every object into its Kubernetes API type, failing on unknown
// fields, unknown kinds and duplicates.
func render(t *testing.T, values string, set ...string) *rendered {
	t.Helper()
	return renderChart(t, chart, "orders", values, set...)
}

// renderChart is render of the chart (a directory or a package) dir as
// release name.
func renderChart(t *testing.T, dir, name, values string, set ...string) *rendered {
	t.Helper()
	args := []string{"template", name, dir, "--namespace", "outbox"}
	if values != "" {
		args = append(args, "--values", values)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var head struct {
			APIVersion, Kind string
			Metadata         struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%s: %v\n%s", values, err, doc)
		}
		hook := strings.HasSuffix(head.Metadata.Name, "-init")
		var target any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			target = once(t, &r.deployment)
		case "batch/v1 Job":
			target = once(t, &r.job)
		case "v1 ConfigMap":
			target = once(t, pick(hook, &r.initConfig, &r.configMap))
		case "v1 Secret":
			target = once(t, pick(hook, &r.initSecret, &r.secret))
		case "v1 Service":
			target = once(t, &r.service)
		case "v1 ServiceAccount":
			target = once(t, &r.account)
		case "policy/v1 PodDisruptionBudget":
			target = once(t, &r.pdb)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			target = once(t, &r.monitor)
		case "monitoring.coreos.com/v1 PrometheusRule":
			target = once(t, &r.rule)
		case "networking.k8s.io/v1 NetworkPolicy":
			target = once(t, &r.policy)
		default:
			t.Fatalf("%s: unexpected object %s %s", values, head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			t.Fatalf("%s: %s %s does not decode strictly: %v\n%s", values, head.APIVersion, head.Kind, err, doc)
		}
	}
	return r
}

// pick returns a when cond holds, else b.
func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}

// once allocates *p and returns it, failing when the kind was seen before.
func once[T any](t *testing.T, p **T) *T {
	t.Helper()
	if *p != nil {
		t.Fatalf("two objects of type %T", *p)
	}
	*p = new(T)
	return *p
}

func stripComments(doc string) string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestLint(t *testing.T) {
	for _, v := range valuesFiles(t) {
		args := []string{"lint", "--strict", chart}
		if v != "" {
			args = append(args, "--values", v)
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// TestRender renders the defaults and every example, decodes each object
// strictly into the Kubernetes API types and checks it against the relay:
// the rendered config loads with the relay's own loader (with the Secret's
// environment), listens on the container port the probes and the Service
// use, and drains within terminationGracePeriodSeconds; the pod runs
// non-root on a read-only filesystem with a memory request above the
// measured peak RSS; the PodDisruptionBudget and Service select the pods.
func TestRender(t *testing.T) {
	for _, v := range valuesFiles(t) {
		name := "defaults"
		if v != "" {
			name = filepath.Base(v)
		}
		t.Run(name, func(t *testing.T) {
			r := render(t, v)
			if r.deployment == nil || r.configMap == nil || r.service == nil {
				t.Fatal("no Deployment, ConfigMap or Service")
			}
			checkPod(t, r)
			checkConfig(t, r)
			checkSelectors(t, r)
			if r.job != nil {
				checkInit(t, r)
			}
		})
	}
}

func checkPod(t *testing.T, r *rendered) {
	d := r.deployment
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v: want at least 2 (wal: one streams, one stands by; poll: they share partitions)", d.Spec.Replicas)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args, []string{"run", "--config", "/etc/relay/relay.yaml"}) {
		t.Errorf("args %q", c.Args)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" {
		t.Fatalf("ports %+v: want one named http", c.Ports)
	}
	for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.String() != "http" {
			t.Errorf("probe %+v: want httpGet %s on port http", probe, want)
		}
	}
	checkSecurity(t, pod, c)
	if mem, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok || mem.Cmp(peakRSS) < 0 {
		t.Errorf("memory request %v: below the measured peak RSS %v", mem.String(), peakRSS.String())
	}
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && lim.Cmp(c.Resources.Requests[corev1.ResourceMemory]) < 0 {
		t.Errorf("memory limit %v below the request", lim.String())
	}
	checkMounts(t, pod, c, r.configMap.Name)
}

// checkMounts checks that container c of pod mounts ConfigMap config at
// /etc/relay, read-only, first, and every other volume of the pod
// elsewhere.
func checkMounts(t *testing.T, pod corev1.PodSpec, c corev1.Container, config string) {
	if len(c.VolumeMounts) == 0 || c.VolumeMounts[0].MountPath != "/etc/relay" || !c.VolumeMounts[0].ReadOnly ||
		len(pod.Volumes) == 0 || pod.Volumes[0].ConfigMap == nil || pod.Volumes[0].ConfigMap.Name != config ||
		c.VolumeMounts[0].Name != pod.Volumes[0].Name {
		t.Errorf("%s: the config mount: %+v %+v", c.Name, c.VolumeMounts, pod.Volumes)
		return
	}
	for _, m := range c.VolumeMounts[1:] {
		if strings.HasPrefix(m.MountPath+"/", "/etc/relay/") {
			t.Errorf("%s: %s mounted at %s, inside the config's read-only mount", c.Name, m.Name, m.MountPath)
		}
		if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("%s: mount %s of no volume", c.Name, m.Name)
		}
	}
}

// checkSecurity checks that container c of pod runs non-root on a
// read-only root filesystem, without privilege escalation or capabilities.
// A runAsUser, if any, is not root; without one the image's user runs
// (imageUser checks it is numeric, so runAsNonRoot can be enforced).
func checkSecurity(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	psc, sc := pod.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || (psc.RunAsUser != nil && *psc.RunAsUser == 0) {
		t.Errorf("%s: pod security context %+v: want non-root", c.Name, psc)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil ||
		*sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: container security context %+v: want a read-only root, no privilege escalation, no capabilities", c.Name, sc)
	}
}

// checkConfig loads the ConfigMap's relay.yaml with the relay's loader, in
// the environment the pod gets from the Secret (a referenced Secret the
// chart does not make gets placeholder values), and compares it with the
// pod.
func checkConfig(t *testing.T, r *rendered) {
	text := configText(t, r.configMap)
	c := r.deployment.Spec.Template.Spec.Containers[0]
	cfg := loadConfig(t, text, podEnv(t, c, text, r.secret), false)
	if want := "0.0.0.0:" + strconv.Itoa(int(c.Ports[0].ContainerPort)); cfg.HTTP.Listen != want {
		t.Errorf("http.listen %q, want %q: the probes and the Service use port %d", cfg.HTTP.Listen, want, c.Ports[0].ContainerPort)
	}
	grace := r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= cfg.ShutdownTimeout.D() {
		t.Errorf("terminationGracePeriodSeconds %v is not above shutdown_timeout %s", grace, cfg.ShutdownTimeout.D())
	}
}

// configText returns the relay.yaml of cm, its only key.
func configText(t *testing.T, cm *corev1.ConfigMap) string {
	text, ok := cm.Data["relay.yaml"]
	if !ok || len(cm.Data) != 1 {
		t.Fatalf("ConfigMap %s data keys %v: want relay.yaml only", cm.Name, cm.Data)
	}
	return text
}

// variable matches a ${VAR} or ${VAR:-default} reference.
var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}`)

// podEnv returns the environment container c gets: the variables of its
// envFrom Secrets, later ones winning (a Secret of made, which the chart
// renders, gives its data; any other must be an existing Secret named in
// the values, assumed to hold every variable text refers to), then env.
func podEnv(t *testing.T, c corev1.Container, text string, made ...*corev1.Secret) map[string]string {
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.SecretRef == nil {
			// A ConfigMap of extraEnvFrom, like an existing Secret.
			for _, m := range variable.FindAllStringSubmatch(text, -1) {
				env[m[1]] = "from-extra-env-from"
			}
			continue
		}
		i := slices.IndexFunc(made, func(s *corev1.Secret) bool { return s != nil && s.Name == from.SecretRef.Name })
		switch {
		case i >= 0:
			maps.Copy(env, made[i].StringData)
		case strings.HasPrefix(from.SecretRef.Name, "orders-"):
			t.Errorf("%s: envFrom names Secret %s, which the chart does not render", c.Name, from.SecretRef.Name)
		default:
			for _, m := range variable.FindAllStringSubmatch(text, -1) {
				env[m[1]] = "from-existing-secret"
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// loadConfig loads text with the relay's loader in the environment env
// only; with strict, it fails when text refers to a variable without a
// default that env lacks (the chart's defaults leave PGPASSWORD to the
// user).
func loadConfig(t *testing.T, text string, env map[string]string, strict bool) *config.Config {
	for _, m := range variable.FindAllStringSubmatch(text, -1) {
		if _, ok := env[m[1]]; strict && !ok && m[2] == "" {
			t.Errorf("the config refers to ${%s}, which the pod's environment lacks", m[1])
		}
	}
	for _, m := range variable.FindAllStringSubmatch(text, -1) {
		t.Setenv(m[1], env[m[1]])
	}
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, text)
	}
	if strings.Contains(cfg.Postgres.URL, "${") {
		t.Errorf("postgres.url not expanded: %s", cfg.Postgres.URL)
	}
	return cfg
}

// checkInit checks the init Job: a pre-install and pre-upgrade hook after
// its ConfigMap and Secret, running `relay init` non-root on its own
// config, which loads with the Job's environment and differs from the
// relay's only in postgres (the owner role); the owner's variables reach
// the Job and never the relay's pods; no selector of the relay selects
// the Job's pod.
func checkInit(t *testing.T, r *rendered) {
	if r.initConfig == nil {
		t.Fatal("an init Job without its ConfigMap")
	}
	weight := func(o metav1.ObjectMeta) int {
		if !slices.Equal(strings.Split(o.Annotations["helm.sh/hook"], ","), []string{"pre-install", "pre-upgrade"}) {
			t.Errorf("%s: hook %q, want pre-install,pre-upgrade", o.Name, o.Annotations["helm.sh/hook"])
		}
		w, err := strconv.Atoi(o.Annotations["helm.sh/hook-weight"])
		if err != nil {
			t.Errorf("%s: hook weight %v", o.Name, err)
		}
		return w
	}
	jw := weight(r.job.ObjectMeta)
	for _, o := range []metav1.Object{r.initConfig, r.initSecret} {
		if o != nil && !reflect.ValueOf(o).IsNil() && weight(metav1.ObjectMeta{Name: o.GetName(), Annotations: o.GetAnnotations()}) >= jw {
			t.Errorf("%s is created after the Job that needs it", o.GetName())
		}
	}
	pod := r.job.Spec.Template.Spec
	if pod.RestartPolicy != corev1.RestartPolicyNever || len(pod.Containers) != 1 {
		t.Fatalf("Job pod: restartPolicy %q, %d containers", pod.RestartPolicy, len(pod.Containers))
	}
	c := pod.Containers[0]
	if !slices.Equal(c.Args[:3], []string{"init", "--config", "/etc/relay/relay.yaml"}) {
		t.Errorf("Job args %q", c.Args)
	}
	checkMounts(t, pod, c, r.initConfig.Name)
	checkSecurity(t, pod, c)

	runText, initText := configText(t, r.configMap), configText(t, r.initConfig)
	relayEnv := podEnv(t, r.deployment.Spec.Template.Spec.Containers[0], runText, r.secret)
	run := loadConfig(t, runText, relayEnv, false)
	init := loadConfig(t, initText, podEnv(t, c, initText, r.secret, r.initSecret), true)
	if init.Postgres.URL == run.Postgres.URL {
		t.Errorf("the Job signs in as the relay's role (%s): want the owner's, init.postgres.url", run.Postgres.URL)
	}
	init.Postgres = run.Postgres
	if !reflect.DeepEqual(init, run) {
		t.Errorf("the Job's config differs from the relay's beyond postgres:\n%s\n%s", initText, runText)
	}
	for _, m := range variable.FindAllStringSubmatch(initText, -1) {
		if _, ok := relayEnv[m[1]]; ok && !strings.Contains(runText, m[0]) {
			t.Errorf("the relay's pods get ${%s}, which only the Job's config (the owner role) uses", m[1])
		}
	}
	for _, from := range r.deployment.Spec.Template.Spec.Containers[0].EnvFrom {
		if r.initSecret != nil && from.SecretRef != nil && from.SecretRef.Name == r.initSecret.Name {
			t.Errorf("the relay's pods get the Job's Secret %s", r.initSecret.Name)
		}
	}
	jobPod := labels.Set(r.job.Spec.Template.Labels)
	for what, sel := range map[string]map[string]string{"Deployment": r.deployment.Spec.Selector.MatchLabels,
		"Service": r.service.Spec.Selector, "PodDisruptionBudget": r.pdb.Spec.Selector.MatchLabels} {
		if labels.SelectorFromSet(sel).Matches(jobPod) {
			t.Errorf("the %s selects the init Job's pod", what)
		}
	}
}

func checkSelectors(t *testing.T, r *rendered) {
	pods := labels.Set(r.deployment.Spec.Template.Labels)
	if !labels.SelectorFromSet(r.deployment.Spec.Selector.MatchLabels).Matches(pods) {
		t.Error("the Deployment's selector does not match its pods")
	}
	if !labels.SelectorFromSet(r.service.Spec.Selector).Matches(pods) || r.service.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("the Service does not reach the pods' http port: %+v", r.service.Spec)
	}
	if r.pdb == nil || !labels.SelectorFromSet(r.pdb.Spec.Selector.MatchLabels).Matches(pods) ||
		r.pdb.Spec.MinAvailable == nil || r.pdb.Spec.MinAvailable.IntValue() >= int(*r.deployment.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget %+v: want one selecting the pods that lets one be evicted", r.pdb)
	}
	if m := r.monitor; m != nil {
		if !labels.SelectorFromSet(m.Spec.Selector.MatchLabels).Matches(labels.Set(r.service.Labels)) ||
			len(m.Spec.Endpoints) != 1 || m.Spec.Endpoints[0].Port != "http" || m.Spec.Endpoints[0].Path != "/metrics" ||
			r.service.Labels[m.Spec.JobLabel] != "relay" {
			t.Errorf("ServiceMonitor %+v: want /metrics on the Service's http port as job relay", m.Spec)
		}
		checkIdentity(t, m, r.service.Name)
	}
	if r.rule != nil {
		checkRules(t, r.rule)
	}
}

// checkIdentity checks that the ServiceMonitor labels every target with
// relay, the release's full name (the Service's name), which the alert rules
// and the dashboard keep beside namespace to tell releases apart.
func checkIdentity(t *testing.T, m *monitoringv1.ServiceMonitor, fullname string) {
	t.Helper()
	for _, e := range m.Spec.Endpoints {
		for _, rc := range e.RelabelConfigs {
			if rc.TargetLabel == "relay" && len(rc.SourceLabels) == 0 && rc.Replacement != nil && *rc.Replacement == fullname &&
				(rc.Action == "" || rc.Action == "replace") {
				return
			}
		}
	}
	t.Errorf("ServiceMonitor %+v: want a relabeling that sets the label relay to %s", m.Spec.Endpoints, fullname)
}

// checkRules compares the PrometheusRule's groups with deploy/alerts.yaml.
func checkRules(t *testing.T, rule *monitoringv1.PrometheusRule) {
	data, err := os.ReadFile(filepath.Join("..", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(data, &want); err != nil {
		t.Fatalf("deploy/alerts.yaml: %v", err)
	}
	if len(want.Groups) == 0 || !reflect.DeepEqual(rule.Spec, want) {
		t.Errorf("the PrometheusRule's groups differ from deploy/alerts.yaml")
	}
}

// TestValuesRejected renders values the schema refuses: the keys the chart
// sets itself, an unknown key, a wrong type.
func TestValuesRejected(t *testing.T) {
	for _, set := range []string{"config.http.listen=127.0.0.1:9090", "config.shutdown_timeout=20s", "replicas=2",
		"replicaCount=two", "config.capture.mode=stream", "service.port=0", "init.enabled=true", "init.lockTimeout=5",
		"extraVolumeMounts[0].name=nats,extraVolumeMounts[0].mountPath=/etc/relay/nats", "extraVolumes[0].name=config",
		"networkPolicy.enabled=true", "podAntiAffinity=always", "livenessProbe.httpGet.path=/metrics",
		"extraEnvFrom[0].secret.name=x", "fullnameOverride=Orders_Relay"} {
		if out, err := runHelm(t, "template", "orders", chart, "--set", set); err == nil || !strings.Contains(err.Error(), "schema") {
			t.Errorf("--set %s: want a schema error, got %v\n%s", set, err, out)
		}
	}
}

// TestRulesOneSource checks that the chart's files/alerts.yaml, a file of
// its own so that a copied or packaged chart has it, holds deploy/alerts.yaml
// byte for byte: deploy/alerts.yaml is the source, copy it over after every
// change.
func TestRulesOneSource(t *testing.T) {
	copied := filepath.Join(chart, "files", "alerts.yaml")
	if fi, err := os.Lstat(copied); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s should be a regular file, a copy of deploy/alerts.yaml: %v %v", copied, fi.Mode(), err)
	}
	want, err := os.ReadFile(filepath.Join("..", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(copied); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s differs from deploy/alerts.yaml (%v): cp deploy/alerts.yaml deploy/helm/relay/files/alerts.yaml", copied, err)
	}
	r := render(t, "", "prometheusRule.enabled=true")
	if r.rule == nil {
		t.Fatal("no PrometheusRule")
	}
	checkRules(t, r.rule)
}

// TestInitJobSecrets renders the init Job with the Secrets the values can
// name: the relay's existing Secret and the owner's, in that order after
// the Job's own, so the owner's variables win; the relay's pods get only
// theirs. Without any secret (e.g. RDS IAM authentication for the owner)
// the Job has no envFrom.
func TestInitJobSecrets(t *testing.T) {
	example := filepath.Join(chart, "examples", "wal-kafka-init.yaml")
	for _, c := range []struct {
		values   string
		set      []string
		job, run []string
	}{
		{example, nil, []string{"orders-relay-init"}, []string{"orders-relay"}},
		{example, []string{"existingSecret=relay-creds", "init.existingSecret=owner-creds"},
			[]string{"relay-creds", "orders-relay-init", "owner-creds"}, []string{"relay-creds"}},
		{example, []string{"existingSecret=relay-creds", "init.existingSecret=owner-creds", "init.secretEnv=null"},
			[]string{"relay-creds", "owner-creds"}, []string{"relay-creds"}},
		{"", []string{"init.enabled=true", "init.postgres.url=postgres://owner@db:5432/app"}, nil, nil},
	} {
		r := render(t, c.values, c.set...)
		if r.job == nil {
			t.Fatalf("%v: no init Job", c.set)
		}
		names := func(c corev1.Container) (n []string) {
			for _, f := range c.EnvFrom {
				n = append(n, f.SecretRef.Name)
			}
			return n
		}
		if got := names(r.job.Spec.Template.Spec.Containers[0]); !slices.Equal(got, c.job) {
			t.Errorf("%v: the Job's Secrets %q, want %q", c.set, got, c.job)
		}
		if got := names(r.deployment.Spec.Template.Spec.Containers[0]); !slices.Equal(got, c.run) {
			t.Errorf("%v: the relay's Secrets %q, want %q", c.set, got, c.run)
		}
		checkInit(t, r)
	}
}

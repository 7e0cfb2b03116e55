package helm_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// platformExample is the example of what a platform team sets.
var platformExample = filepath.Join(chart, "examples", "platform.yaml")

// TestPlatformValues renders examples/platform.yaml, with the init Job, and
// checks that every value a platform team sets reaches both pods: the
// Secrets mounted beside the config, extraEnv and extraEnvFrom, the
// priority class; the relay's pods keep to one per node and spread over
// zones, their probes take the timings; the NetworkPolicy selects both
// pods, admits the monitoring namespace to the http port only and lets
// them reach DNS, Postgres and NATS.
func TestPlatformValues(t *testing.T) {
	t.Parallel()
	r := render(t, platformExample, "init.enabled=true", "init.postgres.url=postgres://owner@orders-db.databases:5432/app")
	if r.deployment.Name != "orders-outbox" || r.job.Name != "orders-outbox-init" || r.configMap.Name != "orders-outbox" {
		t.Errorf("names %s, %s, %s: want fullnameOverride orders-outbox", r.deployment.Name, r.job.Name, r.configMap.Name)
	}
	pod := r.deployment.Spec.Template.Spec
	for _, p := range []corev1.PodSpec{pod, r.job.Spec.Template.Spec} {
		c := p.Containers[0]
		var mounts []string
		for _, m := range c.VolumeMounts {
			mounts = append(mounts, m.MountPath)
		}
		if want := []string{"/etc/relay", "/etc/relay-secrets/postgres", "/etc/relay-secrets/nats", "/etc/relay-secrets/nats-ca"}; !slices.Equal(mounts, want) {
			t.Errorf("%s: mounts %q, want %q", c.Name, mounts, want)
		}
		if len(p.Volumes) != 4 || p.Volumes[1].Secret == nil || p.Volumes[1].Secret.SecretName != "orders-db-relay" {
			t.Errorf("%s: volumes %+v", c.Name, p.Volumes)
		}
		if p.PriorityClassName != "outbox-critical" {
			t.Errorf("%s: priorityClassName %q", c.Name, p.PriorityClassName)
		}
		if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
			return e.ConfigMapRef != nil && e.ConfigMapRef.Name == "cluster-settings"
		}) {
			t.Errorf("%s: envFrom %+v lacks the ConfigMap cluster-settings", c.Name, c.EnvFrom)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" && e.ValueFrom != nil }) {
			t.Errorf("%s: env %+v lacks GOMEMLIMIT", c.Name, c.Env)
		}
	}

	pods := labels.Set(r.deployment.Spec.Template.Labels)
	a := pod.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity %+v: want a required pod anti-affinity (podAntiAffinity: hard)", a)
	}
	checkTerm(t, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0], pods)
	if len(pod.TopologySpreadConstraints) != 1 || !selects(t, pod.TopologySpreadConstraints[0].LabelSelector, pods) ||
		pod.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" {
		t.Errorf("topologySpreadConstraints %+v: want the zone spread selecting the relay's pods", pod.TopologySpreadConstraints)
	}
	rp := pod.Containers[0].ReadinessProbe
	if rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.PeriodSeconds != 10 || rp.FailureThreshold != 3 || rp.TimeoutSeconds != 2 {
		t.Errorf("readinessProbe %+v: want /readyz with the example's timings", rp)
	}
	if lp := pod.Containers[0].LivenessProbe; lp.PeriodSeconds != 10 || lp.FailureThreshold != 3 {
		t.Errorf("livenessProbe %+v: want the defaults", lp)
	}
	checkPolicy(t, r)
}

// checkPolicy checks r's NetworkPolicy against examples/platform.yaml.
func checkPolicy(t *testing.T, r *rendered) {
	np := r.policy
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	for what, pod := range map[string]map[string]string{"relay": r.deployment.Spec.Template.Labels, "init Job": r.job.Spec.Template.Labels} {
		if !selects(t, &np.Spec.PodSelector, pod) {
			t.Errorf("the NetworkPolicy does not select the %s's pod", what)
		}
	}
	if other := map[string]string{"app.kubernetes.io/name": "relay", "app.kubernetes.io/instance": "billing"}; selects(t, &np.Spec.PodSelector, other) {
		t.Error("the NetworkPolicy selects another release's pods")
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("policyTypes %v", np.Spec.PolicyTypes)
	}
	in := np.Spec.Ingress
	if len(in) != 1 || len(in[0].Ports) != 1 || in[0].Ports[0].Port.String() != "http" || len(in[0].From) != 1 ||
		in[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("ingress %+v: want the http port, from the monitoring namespace", in)
	}
	var ports []string
	for _, e := range np.Spec.Egress {
		for _, p := range e.Ports {
			ports = append(ports, string(*p.Protocol)+"/"+p.Port.String())
		}
	}
	if want := []string{"UDP/53", "TCP/53", "TCP/5432", "TCP/4222"}; !slices.Equal(ports, want) {
		t.Errorf("egress ports %q, want %q", ports, want)
	}
}

// checkTerm checks that the anti-affinity term keeps the pods of set one
// per node.
func checkTerm(t *testing.T, term corev1.PodAffinityTerm, pods labels.Set) {
	t.Helper()
	if term.TopologyKey != "kubernetes.io/hostname" || !selects(t, term.LabelSelector, pods) {
		t.Errorf("anti-affinity term %+v: want one per node of the relay's pods", term)
	}
	if other := map[string]string{"app.kubernetes.io/name": "relay", "app.kubernetes.io/instance": "billing"}; selects(t, term.LabelSelector, other) {
		t.Error("the anti-affinity term keeps away from another release's pods")
	}
}

// selects reports whether sel matches a pod with labels set.
func selects(t *testing.T, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %+v: %v", sel, err)
	}
	return sel != nil && !s.Empty() && s.Matches(set)
}

// TestAntiAffinity checks the relay's default placement: by default the
// scheduler prefers its replicas on different nodes; podAntiAffinity ""
// leaves placement to the scheduler, and affinity replaces it.
func TestAntiAffinity(t *testing.T) {
	t.Parallel()
	r := render(t, "")
	a := r.deployment.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity %+v: want a preferred pod anti-affinity", a)
	}
	checkTerm(t, a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm, r.deployment.Spec.Template.Labels)
	if r := render(t, "", "podAntiAffinity="); r.deployment.Spec.Template.Spec.Affinity != nil {
		t.Errorf(`podAntiAffinity "": affinity %+v`, r.deployment.Spec.Template.Spec.Affinity)
	}
	r = render(t, "", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")
	if a := r.deployment.Spec.Template.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.PodAntiAffinity != nil {
		t.Errorf("affinity %+v: want the values' node affinity only", a)
	}
}

// TestSubchart renders the packaged chart as the subchart of a parent
// chart whose global values carry keys the chart does not know: the values
// schema accepts them, and the chart takes global.imageRegistry and
// global.imagePullSecrets.
func TestSubchart(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	write(t, filepath.Join(parent, "Chart.yaml"), `apiVersion: v2
name: shop
version: 1.0.0
dependencies:
  - name: relay
    version: "*"
    repository: file://relay
`)
	write(t, filepath.Join(parent, "values.yaml"), `global:
  imageRegistry: registry.example.com
  imagePullSecrets: [{name: regcred}]
  environment: production
relay:
  secretEnv:
    PGPASSWORD: change-me
`)
	packageChart(t, filepath.Join(parent, "charts"))
	r := renderChart(t, parent, "shop", "")
	pod := r.deployment.Spec.Template.Spec
	if r.deployment.Name != "shop-relay" || pod.Containers[0].Image != "registry.example.com/outboxrelay/relay:"+appVersion(t) {
		t.Errorf("Deployment %s, image %s", r.deployment.Name, pod.Containers[0].Image)
	}
	if !slices.Equal(pod.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}}) {
		t.Errorf("imagePullSecrets %+v", pod.ImagePullSecrets)
	}
	checkPod(t, r)
}

// TestPackage packages the chart, copies its directory elsewhere, and
// renders both with every object: what a chart repository serves and a
// vendored copy must hold everything the chart reads, the alert rules
// included.
func TestPackage(t *testing.T) {
	t.Parallel()
	copied := filepath.Join(t.TempDir(), "relay")
	if err := os.CopyFS(copied, os.DirFS(chart)); err != nil {
		t.Fatalf("copying the chart: %v", err)
	}
	for _, dir := range []string{packageChart(t, t.TempDir()), copied} {
		if out, err := runHelm(t, "lint", "--strict", dir, "--values", platformExample); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
		r := renderChart(t, dir, "orders", platformExample)
		if r.rule == nil || r.monitor == nil || r.policy == nil {
			t.Fatalf("%s: no PrometheusRule, ServiceMonitor or NetworkPolicy", dir)
		}
		checkRules(t, r.rule)
		checkPod(t, r)
	}
}

// packageChart runs helm package on the chart into dir and returns the
// package's path.
func packageChart(t *testing.T, dir string) string {
	t.Helper()
	if _, err := runHelm(t, "package", chart, "--destination", dir); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(dir, "relay-"+chartMeta(t).Version+".tgz")
	if _, err := os.Stat(pkg); err != nil {
		t.Fatal(err)
	}
	return pkg
}

// chartYAML is what the tests read of Chart.yaml.
type chartYAML struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func chartMeta(t *testing.T) chartYAML {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c chartYAML
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func appVersion(t *testing.T) string { return chartMeta(t).AppVersion }

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.TrimLeft(text, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestNoFixedUser checks that neither the relay's pods nor the init Job's
// fix a uid, gid or fsGroup, by default and in examples/openshift.yaml:
// OpenShift's restricted SCC refuses one outside the namespace's range and
// assigns its own; runAsNonRoot checks the image's numeric user.
func TestNoFixedUser(t *testing.T) {
	t.Parallel()
	for _, values := range []string{"", filepath.Join(chart, "examples", "openshift.yaml")} {
		r := render(t, values, "init.enabled=true", "init.postgres.url=postgres://owner@db:5432/app")
		for _, pod := range []corev1.PodSpec{r.deployment.Spec.Template.Spec, r.job.Spec.Template.Spec} {
			psc, sc := pod.SecurityContext, pod.Containers[0].SecurityContext
			if psc.RunAsUser != nil || psc.RunAsGroup != nil || psc.FSGroup != nil || sc.RunAsUser != nil || sc.RunAsGroup != nil {
				t.Errorf("%q: %s: security contexts %+v %+v fix a uid or gid", values, pod.Containers[0].Name, psc, sc)
			}
			checkSecurity(t, pod, pod.Containers[0])
		}
	}
}

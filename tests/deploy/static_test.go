package deploytest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/promql/parser"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	psaapi "k8s.io/pod-security-admission/api"
	psapolicy "k8s.io/pod-security-admission/policy"
)

const ns = "kube-overcommit"

// renderings holds every way an operator installs kube-overcommit, rendered once per test binary.
type renderings struct {
	root       string
	kustomize  []*unstructured.Unstructured // deploy/ (the default install)
	production []*unstructured.Unstructured // deploy/overlays/production (all components)
	helm       []*unstructured.Unstructured // chart, default values
	helmAll    []*unstructured.Unstructured // chart, every optional object on
	// In-process mode (Kubernetes 1.36+, so not in production/helmAll): deploy/ with
	// components/request-cap and components/in-process, and the chart with both turned on.
	inProcess     []*unstructured.Unstructured
	helmInProcess []*unstructured.Unstructured
	// The compiled policy kept by the operator: deploy/ with components/in-process-operator,
	// and the chart with inProcess.policy=operator.
	operator     []*unstructured.Unstructured
	helmOperator []*unstructured.Unstructured
}

var helmInProcessArgs = []string{"--set", "requestCap.enabled=true", "--set", "inProcess.enabled=true"}
var helmOperatorArgs = []string{"--set", "inProcess.enabled=true", "--set", "inProcess.policy=operator"}

// helmAllArgs turns on every optional object of the chart, matching deploy/overlays/production
// (plus the default policy, which kustomize ships as deploy/examples instead).
var helmAllArgs = []string{
	"--set", "monitoring.serviceMonitor.enabled=true",
	"--set", "monitoring.prometheusRule.enabled=true",
	"--set", "monitoring.dashboard.enabled=true",
	"--set", "networkPolicy.enabled=true",
	"--set", "policy.create=true",
	"--set", "requestCap.enabled=true",
}

func render(t *testing.T) *renderings {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	r := &renderings{root: root}
	load := func(what string, stream []byte, err error) []*unstructured.Unstructured {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		objs, err := Parse(stream)
		if err != nil {
			t.Fatalf("%s: parse: %v", what, err)
		}
		if len(objs) == 0 {
			t.Fatalf("%s: no objects", what)
		}
		return objs
	}
	b, err := Kustomize(root, "deploy")
	r.kustomize = load("kustomize deploy", b, err)
	b, err = Kustomize(root, "deploy/overlays/production")
	r.production = load("kustomize deploy/overlays/production", b, err)
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err = HelmTemplate(root, helm, ns)
	r.helm = load("helm template (defaults)", b, err)
	b, err = HelmTemplate(root, helm, ns, helmAllArgs...)
	r.helmAll = load("helm template (all optional objects)", b, err)
	b, err = Kustomize(root, "tests/deploy/testdata/components")
	r.inProcess = load("kustomize deploy/ + request-cap + in-process", b, err)
	b, err = HelmTemplate(root, helm, ns, helmInProcessArgs...)
	r.helmInProcess = load("helm template (requestCap, inProcess)", b, err)
	b, err = Kustomize(root, "tests/deploy/testdata/operator")
	r.operator = load("kustomize deploy/ + in-process-operator", b, err)
	b, err = HelmTemplate(root, helm, ns, helmOperatorArgs...)
	r.helmOperator = load("helm template (inProcess, policy operator)", b, err)
	return r
}

func keys(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, Key(o))
	}
	sort.Strings(out)
	return out
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &v, true); err != nil {
		t.Fatalf("%s: %v", Key(o), err)
	}
	return &v
}

func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := Find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s among %v", kind, name, keys(objs))
	}
	return o
}

func TestStaticInstallContainsEverything(t *testing.T) {
	r := render(t)
	want := []string{
		"CustomResourceDefinition//overcommitpolicies.overcommit.dev",
		"Namespace//kube-overcommit",
		"ServiceAccount/kube-overcommit/kube-overcommit",
		"ResourceQuota/kube-overcommit/kube-overcommit",
		"Role/kube-overcommit/kube-overcommit",
		"RoleBinding/kube-overcommit/kube-overcommit",
		"Role/default/kube-overcommit-events",
		"RoleBinding/default/kube-overcommit-events",
		"ClusterRole//kube-overcommit",
		"ClusterRoleBinding//kube-overcommit",
		"Service/kube-overcommit/kube-overcommit",
		"Deployment/kube-overcommit/kube-overcommit",
		"PodDisruptionBudget/kube-overcommit/kube-overcommit",
		"ValidatingAdmissionPolicy//kube-overcommit-webhook-guard",
		"ValidatingAdmissionPolicyBinding//kube-overcommit-webhook-guard",
		"ValidatingAdmissionPolicy//kube-overcommit-node-guard",
		"ValidatingAdmissionPolicyBinding//kube-overcommit-node-guard",
	}
	if got := keys(r.kustomize); !reflect.DeepEqual(got, sorted(want)) {
		t.Errorf("deploy/ renders\n  %v\nwant\n  %v", got, sorted(want))
	}
	optional := []string{
		"Service/kube-overcommit/kube-overcommit-metrics",
		"ServiceMonitor/kube-overcommit/kube-overcommit",
		"PrometheusRule/kube-overcommit/kube-overcommit",
		"ConfigMap/kube-overcommit/kube-overcommit-dashboard",
		"NetworkPolicy/kube-overcommit/kube-overcommit",
	}
	if got := keys(r.production); !reflect.DeepEqual(got, sorted(append(slices.Clone(want), optional...))) {
		t.Errorf("deploy/overlays/production renders %v", got)
	}
	inProcess := []string{
		"ClusterRole//kube-overcommit-in-process",
		"ClusterRoleBinding//kube-overcommit-in-process",
		"MutatingAdmissionPolicy//kube-overcommit",
		"MutatingAdmissionPolicyBinding//kube-overcommit",
	}
	if got := keys(r.inProcess); !reflect.DeepEqual(got, sorted(append(slices.Clone(want), inProcess...))) {
		t.Errorf("deploy/ with components/in-process renders %v", got)
	}
	// Kept by the operator: nothing beyond deploy/ (the operator applies the compiled objects).
	if got := keys(r.operator); !reflect.DeepEqual(got, sorted(want)) {
		t.Errorf("deploy/ with components/in-process-operator renders %v", got)
	}
	if got, base := keys(r.helmOperator), keys(r.helm); !reflect.DeepEqual(got, base) {
		t.Errorf("inProcess.policy=operator renders %v, want the default chart's %v", got, base)
	}
}

// components/in-process and the chart's inProcess.enabled install the same objects with the
// same specs: the ClusterRole, its binding, the placeholder MutatingAdmissionPolicy (fail-safe:
// Ignore, a match condition that is always false) and the MutatingAdmissionPolicyBinding (which
// the leader expects exactly as compiled: src/leader/in_process_policy.rs compares both).
func TestStaticInProcessHelmMatchesKustomize(t *testing.T) {
	r := render(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": r.inProcess, "helm": r.helmInProcess} {
		p := convert[admissionregistrationv1.MutatingAdmissionPolicy](t, mustFind(t, objs, "MutatingAdmissionPolicy", "kube-overcommit"))
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Ignore ||
			len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Expression != "false" {
			t.Errorf("%s: the shipped MutatingAdmissionPolicy is not fail-safe: failurePolicy %v, matchConditions %+v",
				name, p.Spec.FailurePolicy, p.Spec.MatchConditions)
		}
		if p.Labels["app.kubernetes.io/managed-by"] != "kube-overcommit" {
			t.Errorf("%s: the shipped MutatingAdmissionPolicy is labelled %v: the leader resets only a policy managed by kube-overcommit", name, p.Labels)
		}
	}
	for _, key := range [][2]string{{"ClusterRole", "kube-overcommit-in-process"}, {"ClusterRoleBinding", "kube-overcommit-in-process"},
		{"MutatingAdmissionPolicy", "kube-overcommit"}, {"MutatingAdmissionPolicyBinding", "kube-overcommit"}} {
		k := mustFind(t, r.inProcess, key[0], key[1])
		h := mustFind(t, r.helmInProcess, key[0], key[1])
		for _, field := range []string{"spec", "rules", "roleRef", "subjects"} {
			if a, b := k.Object[field], h.Object[field]; !reflect.DeepEqual(a, b) {
				t.Errorf("%s: %s differs (kustomize vs helm): %s", Key(k), field, firstDifference(a, b))
			}
		}
	}
	if got, want := keys(r.helmInProcess), keys(r.helm); len(got) != len(want)+4 {
		t.Errorf("inProcess.enabled (and requestCap.enabled) add %v to %v, want the four objects above", got, want)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// The chart must install the same objects as kustomize, with the same specs. Differences that
// are intended: the Namespace (Helm installs into an existing one), the CRD (Helm's crds/ dir,
// not rendered by `helm template` without --include-crds), the default policy (chart value;
// kustomize has deploy/examples), and the labels Helm adds.
func TestStaticHelmMatchesKustomize(t *testing.T) {
	r := render(t)
	var kz []string
	for _, k := range keys(r.production) {
		if !strings.HasPrefix(k, "Namespace/") && !strings.HasPrefix(k, "CustomResourceDefinition/") {
			kz = append(kz, k)
		}
	}
	var hm []string
	for _, k := range keys(r.helmAll) {
		if !strings.HasPrefix(k, "OvercommitPolicy/") {
			hm = append(hm, k)
		}
	}
	if !reflect.DeepEqual(kz, hm) {
		t.Fatalf("objects differ:\n kustomize %v\n helm      %v", kz, hm)
	}
	for _, o := range r.production {
		h := Find(r.helmAll, o.GetKind(), o.GetName())
		if h == nil {
			continue
		}
		for _, field := range []string{"spec", "rules", "roleRef", "subjects", "data"} {
			a, aok := o.Object[field]
			b, bok := h.Object[field]
			if aok != bok {
				t.Errorf("%s: %q present in kustomize %v, helm %v", Key(o), field, aok, bok)
				continue
			}
			a, b = normalize(o.GetKind(), field, a), normalize(o.GetKind(), field, b)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("%s: %s differs (kustomize vs helm): %s", Key(o), field, firstDifference(a, b))
			}
		}
	}
}

// normalize removes what may legitimately differ between the two renderings.
func normalize(kind, field string, v any) any {
	b, _ := json.Marshal(v)
	var c any
	_ = json.Unmarshal(b, &c)
	m, ok := c.(map[string]any)
	if !ok {
		return c
	}
	switch {
	case kind == "Deployment" && field == "spec":
		// Pod template labels/annotations: Helm may add chart labels; compared elsewhere.
		if tmpl, ok := m["template"].(map[string]any); ok {
			delete(tmpl, "metadata")
		}
	case kind == "PrometheusRule" && field == "spec":
		// Thresholds are values in the chart; rules are compared alert by alert in
		// TestStaticPrometheusRules. Comments are not in the data.
	}
	return m
}

// Security and availability properties every rendering of the Deployment must have.
func TestStaticDeploymentInvariants(t *testing.T) {
	r := render(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm, "helm-all": r.helmAll} {
		t.Run(name, func(t *testing.T) {
			d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
			checkDeployment(t, d)
		})
	}
}

// The placement cap is off unless turned on (components/request-cap, requestCap.enabled): the
// container gets --request-cap exactly then.
func TestStaticRequestCapFlag(t *testing.T) {
	r := render(t)
	for name, want := range map[string]bool{"kustomize": false, "helm": false, "production": true, "helm-all": true} {
		objs := map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm, "production": r.production, "helm-all": r.helmAll}[name]
		d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
		args := d.Spec.Template.Spec.Containers[0].Args
		if got := slices.Contains(args, "--request-cap"); got != want {
			t.Errorf("%s: --request-cap in the args %v, want %v (%v)", name, got, want, args)
		}
	}
}

// In-process mode is off unless turned on (components/in-process, inProcess.enabled): the
// container gets --mode=in-process exactly then, and no other --mode.
func TestStaticInProcessFlag(t *testing.T) {
	r := render(t)
	for name, want := range map[string]bool{"kustomize": false, "helm": false, "production": false, "helm-all": false,
		"in-process": true, "helm-in-process": true, "operator": true, "helm-operator": true} {
		objs := map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm, "production": r.production,
			"helm-all": r.helmAll, "in-process": r.inProcess, "helm-in-process": r.helmInProcess,
			"operator": r.operator, "helm-operator": r.helmOperator}[name]
		d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
		args := d.Spec.Template.Spec.Containers[0].Args
		var modes []string
		for _, a := range args {
			if a == "--mode" || strings.HasPrefix(a, "--mode=") || strings.HasPrefix(a, "--in-process-policy") {
				modes = append(modes, a)
			}
		}
		wantModes := []string(nil)
		if want {
			wantModes = []string{"--mode=in-process"}
		}
		if strings.HasSuffix(name, "operator") {
			wantModes = append(wantModes, "--in-process-policy=operator")
		}
		if !slices.Equal(modes, wantModes) {
			t.Errorf("%s: --mode flags %v in the args %v, want %v", name, modes, args, wantModes)
		}
	}
}

func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", d.Spec.Replicas)
	}
	p := d.Spec.Template.Spec
	if p.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q", p.PriorityClassName)
	}
	if p.Affinity == nil || p.Affinity.PodAntiAffinity == nil || len(p.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		p.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("want required pod anti-affinity on kubernetes.io/hostname, got %+v", p.Affinity)
	}
	if len(p.TopologySpreadConstraints) == 0 {
		t.Error("no topologySpreadConstraints")
	}
	for _, c := range p.TopologySpreadConstraints {
		if c.LabelSelector == nil || c.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "kube-overcommit" {
			t.Errorf("topology spread without our selector: %+v", c)
		}
	}
	if !equalMaps(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels) {
		t.Errorf("selector %v not in template labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	if p.HostNetwork || p.HostPID || p.HostIPC {
		t.Error("host namespaces used")
	}
	if p.ServiceAccountName != "kube-overcommit" {
		t.Errorf("serviceAccountName = %q", p.ServiceAccountName)
	}
	checkProjectedToken(t, &p)
	sc := p.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", sc)
	}
	if len(p.Containers) != 1 {
		t.Fatalf("%d containers", len(p.Containers))
	}
	c := p.Containers[0]
	cs := c.SecurityContext
	if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
		cs.Capabilities == nil || !reflect.DeepEqual(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(cs.Capabilities.Add) != 0 ||
		(cs.Privileged != nil && *cs.Privileged) {
		t.Errorf("container securityContext %+v", cs)
	}
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("args %v: want serve first", c.Args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["https"] != 8443 || ports["probes"] != 8080 {
		t.Errorf("ports %v", ports)
	}
	if !slices.Contains(c.Args, "--listen=0.0.0.0:8443") || !slices.Contains(c.Args, "--probe-listen=0.0.0.0:8080") {
		t.Errorf("args %v: listen addresses", c.Args)
	}
	probe := func(name string, pr *corev1.Probe, path string) {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != path || pr.HTTPGet.Port.String() != "probes" {
			t.Errorf("%s probe %+v: want GET %s on port probes", name, pr, path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["POD_NAME"] != "metadata.name" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("downward API env %v", env)
	}
	// preStop sleep, then SIGTERM and drain: the grace period covers both.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("no preStop sleep: %+v", c.Lifecycle)
	}
	sleep := c.Lifecycle.PreStop.Sleep.Seconds
	if p.TerminationGracePeriodSeconds == nil || *p.TerminationGracePeriodSeconds < sleep+10 {
		t.Errorf("terminationGracePeriodSeconds %v must exceed preStop sleep %d by the drain time (>= 10 s)", p.TerminationGracePeriodSeconds, sleep)
	}
	// The server's own shutdown grace must end before the kubelet's SIGKILL.
	var shutdownGrace time.Duration
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--shutdown-grace="); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Errorf("%s: %v", a, err)
			}
			shutdownGrace = d
		}
	}
	if shutdownGrace == 0 || p.TerminationGracePeriodSeconds == nil ||
		time.Duration(sleep)*time.Second+shutdownGrace >= time.Duration(*p.TerminationGracePeriodSeconds)*time.Second {
		t.Errorf("preStop sleep %d s + --shutdown-grace %v must stay below terminationGracePeriodSeconds %v", sleep, shutdownGrace, p.TerminationGracePeriodSeconds)
	}
	if sleep < 5 {
		t.Errorf("preStop sleep %d s is too short for endpoint removal to reach the API servers", sleep)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu/memory requests and a memory limit", c.Resources)
	}
	// The serving Secret is mounted, optional (bootstrap creates it); the CA Secret never is.
	var tlsVol *corev1.Volume
	for i, v := range p.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "kube-overcommit-ca" {
			t.Error("the CA Secret is mounted")
		}
		if v.Secret != nil && v.Secret.SecretName == "kube-overcommit-tls" {
			tlsVol = &p.Volumes[i]
		}
		if v.HostPath != nil {
			t.Errorf("hostPath volume %s", v.Name)
		}
	}
	if tlsVol == nil || tlsVol.Secret.Optional == nil || !*tlsVol.Secret.Optional {
		t.Fatalf("serving Secret volume missing or not optional: %+v", tlsVol)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name == tlsVol.Name {
			mounted = m.ReadOnly && m.MountPath == "/etc/kube-overcommit/tls"
		}
	}
	if !mounted || !slices.Contains(c.Args, "--tls-dir=/etc/kube-overcommit/tls") {
		t.Errorf("serving Secret not mounted read-only at the --tls-dir: %+v %v", c.VolumeMounts, c.Args)
	}
	// The serving key's file mode (SECURITY.md, "What a compromised replica could do"): 0440,
	// no per-item modes, and group 65532 through fsGroup (the kubelet gives Secret volume files
	// the fsGroup as group), the process's own group: readable by the replica, by no other uid.
	if m := tlsVol.Secret.DefaultMode; m == nil {
		t.Error("serving Secret volume has no defaultMode: want 0440")
	} else if *m != 0o440 {
		t.Errorf("serving Secret volume defaultMode %04o: want 0440", *m)
	}
	for _, item := range tlsVol.Secret.Items {
		if item.Mode != nil {
			t.Errorf("serving Secret item %s has its own mode %o", item.Key, *item.Mode)
		}
	}
	if sc == nil || sc.FSGroup == nil || *sc.FSGroup != 65532 || sc.RunAsGroup == nil || *sc.RunAsGroup != 65532 ||
		sc.RunAsUser == nil || *sc.RunAsUser != 65532 || len(sc.SupplementalGroups) != 0 {
		t.Errorf("pod securityContext %+v: want runAsUser, runAsGroup and fsGroup 65532 and no supplementalGroups", sc)
	}
	// Restricted Pod Security Standard, latest version, evaluated by the admission plugin's own code.
	eval, err := psapolicy.NewEvaluator(psapolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	for _, res := range eval.EvaluatePod(lv, &d.Spec.Template.ObjectMeta, &p) {
		if !res.Allowed {
			t.Errorf("restricted pod security: %s: %s", res.ForbiddenReason, res.ForbiddenDetail)
		}
	}
}

// The ServiceAccount token: not automounted, but projected with a short lifetime at the path
// the in-cluster configuration reads (token, ca.crt, namespace).
func checkProjectedToken(t *testing.T, p *corev1.PodSpec) {
	t.Helper()
	if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken = %v, want false", p.AutomountServiceAccountToken)
	}
	var vol *corev1.Volume
	for i, v := range p.Volumes {
		if v.Projected != nil {
			vol = &p.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatal("no projected ServiceAccount token volume")
	}
	files := map[string]string{}
	for _, src := range vol.Projected.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			e := src.ServiceAccountToken.ExpirationSeconds
			if e == nil || *e != 3600 || src.ServiceAccountToken.Audience != "" {
				t.Errorf("token projection %+v: want expirationSeconds 3600 and the API server's audience", src.ServiceAccountToken)
			}
			files[src.ServiceAccountToken.Path] = "token"
		case src.ConfigMap != nil && src.ConfigMap.Name == "kube-root-ca.crt":
			for _, it := range src.ConfigMap.Items {
				files[it.Path] = "configmap " + it.Key
			}
		case src.DownwardAPI != nil:
			for _, it := range src.DownwardAPI.Items {
				if it.FieldRef != nil {
					files[it.Path] = it.FieldRef.FieldPath
				}
			}
		default:
			t.Errorf("unexpected projection source %+v", src)
		}
	}
	if want := map[string]string{"token": "token", "ca.crt": "configmap ca.crt", "namespace": "metadata.namespace"}; !reflect.DeepEqual(files, want) {
		t.Errorf("projected files %v, want %v", files, want)
	}
	mounted := false
	for _, m := range p.Containers[0].VolumeMounts {
		if m.Name == vol.Name {
			mounted = m.ReadOnly && m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
		}
	}
	if !mounted {
		t.Errorf("token volume %s not mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount: %+v", vol.Name, p.Containers[0].VolumeMounts)
	}
}

// The ServiceAccount does not automount; the quota bounds the Secrets and Leases it can create,
// with room for Helm's release history.
func TestStaticServiceAccountAndQuota(t *testing.T) {
	r := render(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm} {
		t.Run(name, func(t *testing.T) {
			sa := convert[corev1.ServiceAccount](t, mustFind(t, objs, "ServiceAccount", "kube-overcommit"))
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Errorf("ServiceAccount automountServiceAccountToken = %v, want false", sa.AutomountServiceAccountToken)
			}
			q := convert[corev1.ResourceQuota](t, mustFind(t, objs, "ResourceQuota", "kube-overcommit"))
			if q.Namespace != ns {
				t.Errorf("quota in namespace %q", q.Namespace)
			}
			secrets, leases := q.Spec.Hard["count/secrets"], q.Spec.Hard["count/leases.coordination.k8s.io"]
			// 2 of kube-overcommit's own + 11 of Helm (10 revisions kept + the one installing).
			if secrets.Value() < 13 || secrets.Value() > 32 {
				t.Errorf("count/secrets = %s: want room for 2 + Helm's 11, and a bound", secrets.String())
			}
			if leases.Value() < 8 || leases.Value() > 64 {
				t.Errorf("count/leases.coordination.k8s.io = %s", leases.String())
			}
			if len(q.Spec.Hard) != 2 {
				t.Errorf("quota limits %v, want only secrets and leases", q.Spec.Hard)
			}
		})
	}
}

// The chart refuses the namespaces it must never share, and can create its own with the
// restricted Pod Security labels of deploy/base/namespace.yaml.
func TestStaticHelmNamespace(t *testing.T) {
	r := render(t)
	helm, err := HelmBinary(r.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"kube-system", "kube-node-lease", "kube-public", "default"} {
		_, err := HelmTemplate(r.root, helm, bad)
		if err == nil || !strings.Contains(err.Error(), "kube-overcommit must not be installed into the namespace "+bad) {
			t.Errorf("helm template into %s: %v, want the refusal", bad, err)
		}
	}
	if Find(r.helm, "Namespace", ns) != nil {
		t.Error("the chart creates its namespace by default")
	}
	b, err := HelmTemplate(r.root, helm, ns, "--set", "namespace.create=true")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	got := mustFind(t, objs, "Namespace", ns).GetLabels()
	for k, v := range mustFind(t, r.kustomize, "Namespace", ns).GetLabels() {
		if strings.HasPrefix(k, "pod-security.kubernetes.io/") && got[k] != v {
			t.Errorf("chart Namespace label %s=%q, want %q (deploy/base/namespace.yaml)", k, got[k], v)
		}
	}
	if got["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("chart Namespace labels %v", got)
	}
}

func equalMaps(sub, super map[string]string, _ map[string]string) bool {
	for k, v := range sub {
		if super[k] != v {
			return false
		}
	}
	return true
}

// RBAC: nothing beyond what SECURITY.md lists, with the placement cap on or off (pods list and
// watch are in the base: usage policies need them too).
func TestStaticRBACLeastPrivilege(t *testing.T) {
	r := render(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm,
		"production": r.production, "helm-all": r.helmAll, "in-process": r.inProcess, "helm-in-process": r.helmInProcess,
		"operator": r.operator, "helm-operator": r.helmOperator} {
		t.Run(name, func(t *testing.T) {
			role := convert[rbacv1.Role](t, mustFind(t, objs, "Role", "kube-overcommit"))
			cr := convert[rbacv1.ClusterRole](t, mustFind(t, objs, "ClusterRole", "kube-overcommit"))
			type grant struct{ group, resource, name, verb string }
			allowed := map[grant]bool{}
			for _, n := range []string{"kube-overcommit-tls", "kube-overcommit-ca"} {
				for _, v := range []string{"get", "list", "watch", "update", "patch"} {
					allowed[grant{"", "secrets", n, v}] = true
				}
			}
			allowed[grant{"", "secrets", "", "create"}] = true
			for _, v := range []string{"create", "get", "list", "watch", "update", "patch", "delete"} {
				allowed[grant{"coordination.k8s.io", "leases", "", v}] = true
			}
			for _, v := range []string{"get", "list", "watch", "update", "patch"} {
				allowed[grant{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "kube-overcommit", v}] = true
			}
			allowed[grant{"admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "create"}] = true
			// The cap's configuration: kept with --request-cap, deleted by the leader without it.
			for _, v := range []string{"get", "list", "watch", "update", "patch", "delete"} {
				allowed[grant{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "kube-overcommit", v}] = true
			}
			allowed[grant{"admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "create"}] = true
			// In-process mode: every install reads the compiled policy and its binding; only with
			// components/in-process (the leader keeps the policy) may it update the policy of its
			// name, and nothing else: never create or delete either object, never write the
			// binding (the install ships both). Kept by the operator: read only.
			inProcess := name == "in-process" || name == "helm-in-process"
			for _, v := range []string{"get", "list", "watch"} {
				allowed[grant{"admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", v}] = true
				allowed[grant{"admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "kube-overcommit", v}] = true
			}
			if inProcess {
				allowed[grant{"admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", "update"}] = true
			}
			for _, v := range []string{"list", "watch"} {
				allowed[grant{"overcommit.dev", "overcommitpolicies", "", v}] = true
				allowed[grant{"", "nodes", "", v}] = true
				allowed[grant{"", "pods", "", v}] = true
			}
			// The leader writes each policy's status with a merge patch of the status
			// subresource: patch only, never update, never the policy itself.
			allowed[grant{"overcommit.dev", "overcommitpolicies/status", "", "patch"}] = true
			// The request cap reads a pod its watch has not shown yet (one GET per such binding).
			allowed[grant{"", "pods", "", "get"}] = true
			allowed[grant{"metrics.k8s.io", "nodes", "", "list"}] = true
			// Memory relief: PodMetrics for the ranking, evictions (never deletes: PDBs hold).
			allowed[grant{"metrics.k8s.io", "pods", "", "list"}] = true
			allowed[grant{"", "pods/eviction", "", "create"}] = true
			// The leader's nudges: an empty merge patch of node status (the node guard bounds it).
			allowed[grant{"", "nodes/status", "", "patch"}] = true
			// The leader's pressure taint: a patch of the node's taints (the node guard bounds it
			// to the taint of key overcommit.dev/pressure, effect NoSchedule).
			allowed[grant{"", "nodes", "", "patch"}] = true
			// Events on nodes and policies, in `default` (cluster-scoped objects' Events).
			events := convert[rbacv1.Role](t, mustFind(t, objs, "Role", "kube-overcommit-events"))
			if events.Namespace != "default" {
				t.Errorf("Role kube-overcommit-events in %q, want default", events.Namespace)
			}
			eb := convert[rbacv1.RoleBinding](t, mustFind(t, objs, "RoleBinding", "kube-overcommit-events"))
			if eb.Namespace != "default" || eb.RoleRef.Name != "kube-overcommit-events" || len(eb.Subjects) != 1 ||
				eb.Subjects[0].Name != "kube-overcommit" || eb.Subjects[0].Namespace != "kube-overcommit" {
				t.Errorf("RoleBinding kube-overcommit-events: %s %+v %+v", eb.Namespace, eb.RoleRef, eb.Subjects)
			}
			allowed[grant{"events.k8s.io", "events", "", "create"}] = true
			allowed[grant{"events.k8s.io", "events", "", "patch"}] = true
			rules := append(slices.Clone(role.Rules), cr.Rules...)
			rules = append(rules, events.Rules...)
			if ip := Find(objs, "ClusterRole", "kube-overcommit-in-process"); ip != nil {
				if !inProcess {
					t.Errorf("ClusterRole kube-overcommit-in-process rendered without in-process mode")
				}
				rules = append(rules, convert[rbacv1.ClusterRole](t, ip).Rules...)
				b := convert[rbacv1.ClusterRoleBinding](t, mustFind(t, objs, "ClusterRoleBinding", "kube-overcommit-in-process"))
				if b.RoleRef.Name != "kube-overcommit-in-process" || len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" ||
					b.Subjects[0].Name != "kube-overcommit" || b.Subjects[0].Namespace != "kube-overcommit" {
					t.Errorf("ClusterRoleBinding kube-overcommit-in-process: %+v %+v", b.RoleRef, b.Subjects)
				}
			}
			seen := map[grant]bool{}
			for _, rule := range rules {
				if len(rule.NonResourceURLs) > 0 {
					t.Errorf("non-resource URLs granted: %v", rule.NonResourceURLs)
				}
				names := rule.ResourceNames
				if len(names) == 0 {
					names = []string{""}
				}
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						for _, n := range names {
							for _, v := range rule.Verbs {
								gr := grant{g, res, n, v}
								if !allowed[gr] {
									t.Errorf("not least privilege: %+v", gr)
								}
								seen[gr] = true
							}
						}
					}
				}
			}
			for gr := range allowed {
				if !seen[gr] {
					t.Errorf("missing grant %+v", gr)
				}
			}
		})
	}
}

// promql parses an expression the way Prometheus does.
func promql(expr string) error {
	_, err := parser.ParseExpr(expr)
	return err
}

func TestStaticPrometheusRules(t *testing.T) {
	r := render(t)
	kz := convert[monitoringv1.PrometheusRule](t, mustFind(t, r.production, "PrometheusRule", "kube-overcommit"))
	hm := convert[monitoringv1.PrometheusRule](t, mustFind(t, r.helmAll, "PrometheusRule", "kube-overcommit"))
	alerts := func(p *monitoringv1.PrometheusRule) map[string]monitoringv1.Rule {
		out := map[string]monitoringv1.Rule{}
		for _, g := range p.Spec.Groups {
			for _, rule := range g.Rules {
				if err := promql(exprOf(rule.Expr)); err != nil {
					t.Errorf("%s: expression does not parse: %v\n%s", rule.Alert, err, exprOf(rule.Expr))
				}
				if rule.Labels["severity"] == "" {
					t.Errorf("%s: no severity", rule.Alert)
				}
				out[rule.Alert] = rule
			}
		}
		return out
	}
	ka, ha := alerts(kz), alerts(hm)
	for _, name := range []string{"KubeOvercommitWebhookFailingOpen", "KubeOvercommitCertificateExpiresSoon", "KubeOvercommitNodeRequestsAboveRawAllocatable"} {
		if _, ok := ka[name]; !ok {
			t.Errorf("missing alert %s", name)
		}
	}
	if !strings.Contains(exprOf(ka["KubeOvercommitWebhookFailingOpen"].Expr), "apiserver_admission_webhook_fail_open_count") {
		t.Error("fail-open alert does not use the API server's counter")
	}
	if !strings.Contains(exprOf(ka["KubeOvercommitNodeRequestsAboveRawAllocatable"].Expr), "> 1.1") {
		t.Error("requests alert threshold is not 110%")
	}
	if len(ka) != len(ha) {
		t.Errorf("kustomize has %d alerts, helm %d", len(ka), len(ha))
	}
	for name, k := range ka {
		h, ok := ha[name]
		if !ok {
			t.Errorf("helm lacks alert %s", name)
			continue
		}
		he := exprOf(h.Expr)
		if strings.Join(strings.Fields(he), " ") != strings.Join(strings.Fields(exprOf(k.Expr)), " ") {
			t.Errorf("%s: expressions differ\nkustomize: %s\nhelm:      %s", name, exprOf(k.Expr), he)
		}
		if !reflect.DeepEqual(k.Annotations, h.Annotations) || !reflect.DeepEqual(k.Labels, h.Labels) || !reflect.DeepEqual(k.For, h.For) {
			t.Errorf("%s: labels/annotations/for differ", name)
		}
	}
	// Thresholds are chart values.
	helm, err := HelmBinary(r.root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := HelmTemplate(r.root, helm, ns, "--set", "monitoring.prometheusRule.enabled=true",
		"--set", "monitoring.prometheusRule.requestsAboveRawAllocatableRatio=1.3")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("> 1.3")) {
		t.Error("requestsAboveRawAllocatableRatio not applied")
	}
}

// ServiceMonitor and PrometheusRule decode strictly into the Prometheus Operator's own types.
func TestStaticMonitoringTypes(t *testing.T) {
	r := render(t)
	for _, objs := range [][]*unstructured.Unstructured{r.production, r.helmAll} {
		convert[monitoringv1.ServiceMonitor](t, mustFind(t, objs, "ServiceMonitor", "kube-overcommit"))
		convert[monitoringv1.PrometheusRule](t, mustFind(t, objs, "PrometheusRule", "kube-overcommit"))
		svc := convert[corev1.Service](t, mustFind(t, objs, "Service", "kube-overcommit-metrics"))
		sm := convert[monitoringv1.ServiceMonitor](t, mustFind(t, objs, "ServiceMonitor", "kube-overcommit"))
		if !equalMaps(sm.Spec.Selector.MatchLabels, svc.Labels, nil) {
			t.Errorf("ServiceMonitor selector %v does not select the metrics Service %v", sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svc.Spec.Ports[0].Name {
			t.Errorf("ServiceMonitor endpoint %+v vs Service ports %+v", sm.Spec.Endpoints, svc.Spec.Ports)
		}
	}
}

func TestStaticDashboard(t *testing.T) {
	r := render(t)
	for _, objs := range [][]*unstructured.Unstructured{r.production, r.helmAll} {
		cm := convert[corev1.ConfigMap](t, mustFind(t, objs, "ConfigMap", "kube-overcommit-dashboard"))
		if cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("dashboard ConfigMap labels %v", cm.Labels)
		}
		var dash struct {
			UID    string `json:"uid"`
			Title  string `json:"title"`
			Panels []struct {
				ID      int    `json:"id"`
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal([]byte(cm.Data["kube-overcommit.json"]), &dash); err != nil {
			t.Fatalf("dashboard JSON: %v", err)
		}
		if dash.UID == "" || dash.Title == "" || len(dash.Panels) < 8 {
			t.Errorf("dashboard uid %q title %q, %d panels", dash.UID, dash.Title, len(dash.Panels))
		}
		ids := map[int]bool{}
		for _, p := range dash.Panels {
			if ids[p.ID] {
				t.Errorf("duplicate panel id %d", p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				e := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*").Replace(tg.Expr)
				if err := promql(e); err != nil {
					t.Errorf("panel %q: %v\n%s", p.Title, err, tg.Expr)
				}
			}
		}
	}
}

// The chart carries copies of files owned elsewhere (Helm cannot read outside the chart).
func TestStaticChartCopiesUpToDate(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for copy, orig := range map[string]string{
		"charts/kube-overcommit/crds/overcommitpolicies.yaml": "deploy/crd/overcommitpolicies.yaml",
		"charts/kube-overcommit/files/dashboard.json":         "deploy/components/monitoring/dashboard.json",
	} {
		a, err := os.ReadFile(filepath.Join(root, copy))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(root, orig))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run `make chart-sync`", copy, orig)
		}
	}
}

func TestStaticHelmLintAndValidation(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "charts", "kube-overcommit")
	if out, err := execOut(helm, "lint", "--strict", chart); err != nil {
		t.Errorf("helm lint --strict: %v\n%s", err, out)
	}
	// Values are validated: bad input gets a clear error, not a broken manifest.
	for _, c := range []struct {
		set, wantErr string
	}{
		{"webhook.timeoutSeconds=9", "timeoutSeconds"},
		{"podAntiAffinity=sometimes", "podAntiAffinity"},
		{"preStopSleepSeconds=40", "terminationGracePeriodSeconds"},
	} {
		_, err := HelmTemplate(root, helm, ns, "--set", c.set)
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("--set %s: error %v, want one mentioning %s", c.set, err, c.wantErr)
		}
	}
	// Null values keep the binary's defaults: no flag is rendered for them.
	b, err := HelmTemplate(root, helm, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"--webhook-timeout-seconds", "--ca-validity", "--leaf-validity", "--check-interval", "--propagation-delay", "--lease-ttl", "--lease-renew"} {
		if bytes.Contains(b, []byte(flag)) {
			t.Errorf("default render passes %s", flag)
		}
	}
	b, err = HelmTemplate(root, helm, ns, "--set", "webhook.timeoutSeconds=3", "--set", "certificates.leafValidity=1h",
		"--set", "replicaCount=5", "--set", "policy.create=true", "--set", "policy.nodeRatios.memory=1.2")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
	if *d.Spec.Replicas != 5 || !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--leaf-validity=1h") {
		t.Errorf("values not applied: replicas %d args %v", *d.Spec.Replicas, d.Spec.Template.Spec.Containers[0].Args)
	}
	pol := mustFind(t, objs, "OvercommitPolicy", "default")
	ratios, _, _ := unstructured.NestedStringMap(pol.Object, "spec", "nodeRatios")
	if ratios["cpu"] != "1.5" || ratios["memory"] != "1.2" {
		t.Errorf("policy ratios %v (must be strings)", ratios)
	}
}

func execOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func exprOf(e intstr.IntOrString) string { return e.String() }

// firstDifference shows the first differing line of two values' indented JSON, with context.
func firstDifference(a, b any) string {
	ja, _ := json.MarshalIndent(a, "", " ")
	jb, _ := json.MarshalIndent(b, "", " ")
	la, lb := strings.Split(string(ja), "\n"), strings.Split(string(jb), "\n")
	for i := 0; i < len(la) || i < len(lb); i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			from := max(0, i-3)
			return "\n...\n" + strings.Join(la[from:i], "\n") + "\n- " + truncate(x) + "\n+ " + truncate(y)
		}
	}
	return "(no line differs)"
}

func truncate(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// The image pinned by digest (deploy/README.md, "Pinning the image"): an overlay's `digest` and
// the chart's image.digest both give repository@digest, without the tag, and the same reference;
// without them both run the tag. The chart's schema refuses a digest of another form.
func TestStaticImageDigest(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const repo = "ghcr.io/kube-overcommit/kube-overcommit"
	image := func(what string, b []byte, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		objs, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
		return d.Spec.Template.Spec.Containers[0].Image
	}
	b, err := Kustomize(root, "tests/deploy/testdata/digest")
	kz := image("kustomize with digest", b, err)
	b, err = HelmTemplate(root, helm, "kube-overcommit", "--set", "image.digest="+digest)
	hm := image("helm with image.digest", b, err)
	if want := repo + "@" + digest; kz != want || hm != want {
		t.Errorf("pinned by digest: kustomize %q, helm %q, want both %q", kz, hm, want)
	}
	r := render(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": r.kustomize, "helm": r.helm} {
		d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
		if got := d.Spec.Template.Spec.Containers[0].Image; got != repo+":0.1.0" {
			t.Errorf("%s without a digest: image %q, want %s:0.1.0", name, got, repo)
		}
	}
	for _, bad := range []string{"0123", "sha256:XYZ", "sha512:" + digest[7:], digest + "x"} {
		if _, err := HelmTemplate(root, helm, "kube-overcommit", "--set", "image.digest="+bad); err == nil {
			t.Errorf("image.digest=%q: rendered, want refused by the schema", bad)
		}
	}
}

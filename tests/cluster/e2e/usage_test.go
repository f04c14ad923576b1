package e2e

// Issue 16 on the real API server: usage-aware allocatable fed by this replica's caches (a
// watch of pods, NodeMetrics listed from the real metrics-server through the aggregator every
// --usage-interval). One fake node, raw cpu 4, running a pod that requests 3 cpu; the policy
// targets 60% cpu with a ceiling of 4x and falls back to nodeRatios cpu 1.5. The API server
// writes an audit log of every list and watch of pods and nodes.metrics.k8s.io, which tells
// the replicas' requests (kube-rs: no User-Agent, or "kube-overcommit/VERSION (usage)") from
// the Go components' (kube-scheduler, fake kubelets, metrics-server: client-go User-Agents):
//
//  0. Static policies only (one, for other nodes) while the node comes up and a pod is bound
//     to it: no replica lists or watches pods or lists nodes.metrics.k8s.io (audit log), and
//     kube_overcommit_usage_feeder_running is 0. The usage policy is then created: each
//     replica opens one pod watch and polls metrics.k8s.io.
//  1. Before metrics.k8s.io answers, the replicas' caches are not synced: /readyz says so (and
//     stays ready), kube_overcommit_usage_synced{cache="metrics"} is 0, and the node gets the
//     fallback (6 cores), counted as not_synced.
//  2. Scripted usage 20% (800m): allocatable = 3 + 60% x 4 - 0.8 = 4.6 cores, above raw, and
//     kube-scheduler binds a 1.5-cpu pod there that raw (1 cpu free) would not hold.
//  3. Usage raised to 90% (3.6): 4.5 + 2.4 - 3.6 = 3.3 is below raw: allocatable is raw (4), or a
//     value already written less than minChange above it, never less; the pods already bound (4.5 requested) stay, and the scheduler binds nothing more
//     (a 100m pod stays Unschedulable).
//     Then noisy usage (800m +-3% of raw, a new value every 2 s) for USAGE_E2E_NOISE (default
//     20s; `make test-e2e-usage-long` runs 10m): allocatable changes at most once per started
//     minute (minChange 5% of raw is wider than the noise, so in practice never).
//     Then the node's kubelet metrics freeze (the fake kubelet serves its last
//     /metrics/resource again, old timestamps and all): metrics-server keeps listing the node
//     with its old timestamp, the replicas call the sample stale by that timestamp (older than
//     its window + 3 polls), write the fallback (6 cores) and count reason="stale"; thawed, the
//     node follows usage again.
//  3c. A second usage policy over three more fake nodes (4 cpu, 3 requested, usage 200m),
//     target 100%: its ceiling raised from 1.25 to 1.5 under spec.rollout (1 node per 5 s
//     step) moves the nodes from cpu 5 to 6 one per step, none above the ceiling its
//     annotation records (checkUsageRollout, rollout_test.go); then that policy is deleted.
//  4. metrics-server stopped: from the first 503 of metrics.k8s.io, the fallback (6 cores)
//     applies within 3 polls (plus one status write), and kube_overcommit_usage_fallbacks_total
//     {reason="metrics_failing"} counts it.
//  5. The usage policy deleted (static policies only again): every replica's pod watch ends
//     (audit log), the polls stop, the feeder and synced gauges say 0 and /readyz has no usage
//     line.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

// usagePoll is the replicas' --usage-interval in this test.
const usagePoll = 2 * time.Second

func TestUsage(t *testing.T) {
	ownControlPlane(t)
	start := time.Now()
	since := func() string { return fmt.Sprintf("%.1fs", time.Since(start).Seconds()) }
	noise := 20 * time.Second
	if v := os.Getenv("USAGE_E2E_NOISE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("USAGE_E2E_NOISE=%q: %v", v, err)
		}
		noise = d
	}
	audit := newAuditLog(t)
	c := harness.Start(t, harness.Options{APIServerArgs: audit.apiServerArgs})
	if c.External {
		t.Fatal("TestUsage reads its API server's audit log: it needs its own control plane (unset KCP_KUBECONFIG)")
	}
	ctx := harness.Context(t, 7*time.Minute+noise)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	installStart := time.Now()
	in := installReplicas(t, ctx, c, append(slices.Clone(ocServeArgs), "--usage-interval="+usagePoll.String())...)
	t.Logf("installed: %s (%s)", in.Summary(), since())

	// 0. Static policies only: one for other nodes (the usage policy comes once the node is up).
	policy := func(name, label string, spec map[string]any) *unstructured.Unstructured {
		spec["nodeSelector"] = map[string]any{"matchLabels": map[string]any{"e2e-usage": label}}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "overcommit.dev/v1alpha1",
			"kind":       "OvercommitPolicy",
			"metadata":   map[string]any{"name": name},
			"spec":       spec,
		}}
	}
	static := policy("static-pool", "static", map[string]any{"nodeRatios": map[string]any{"cpu": "2"}})
	if _, err := dyn.Resource(ocPolicies).Create(ctx, static, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	staticSince := time.Now()
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "usage", Count: 1, Args: []string{
		"--resource-metrics", "--delete-on-exit", fmt.Sprintf("--cpu=%d", ocNodeCPU), "--memory=8Gi",
		"--labels=e2e-usage=pool", "--status-update-frequency=1s", "--status-report-frequency=3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	node := nodes.Names[0]
	if err := waitNode(ctx, cs, node, 60*time.Second, nodeReady); err != nil {
		t.Fatal(err)
	}
	ns := "usage"
	ocNamespace(t, ctx, cs, ns, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "steady", Namespace: ns,
		Annotations: map[string]string{fakenode.UsageAnnotation: `{"memory":"10Mi"}`}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "app", Image: "registry.example.invalid/app:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}},
		}}}}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Node usage outside pods; metrics-server drops a node whose memory (or cpu) reads 0.
	setUsage := func(cpu string) {
		t.Helper()
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, fakenode.UsageAnnotation, fmt.Sprintf(`{"cpu":%q,"memory":"1Gi"}`, cpu))
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setUsage("800m")
	staged := startUsageStaged(t, ctx, c, ns)

	// 0. Static policies only, the node up with its pod: no replica has asked for pods or
	// NodeMetrics.
	// An absence: observed over at least 5 of the replicas' 1 s policy checks since they started
	// (installing them takes longer than that, so this rarely waits).
	for {
		if got, err := audit.replicaRequests(); err != nil || got.pods != 0 || got.metricsLists != 0 {
			t.Fatalf("no usage policy, yet the replicas asked for pods or NodeMetrics: %+v %v", got, err)
		}
		if v, err := sumMetric(in, "kube_overcommit_usage_feeder_running"); err != nil || v != 0 {
			t.Fatalf("no usage policy: kube_overcommit_usage_feeder_running sums to %v (%v)", v, err)
		}
		if time.Since(installStart) >= 5*time.Second {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("no usage policy for %v since the replicas started (static policies only for the last %v, the node up, a pod bound): no pod list or watch and no NodeMetrics list by a replica (audit log) (%s)",
		time.Since(installStart).Round(100*time.Millisecond), time.Since(staticSince).Round(100*time.Millisecond), since())
	// The usage policy: the replicas start their caches while the node is already up.
	usagePolicy := policy("usage-pool", "pool", map[string]any{
		"nodeRatios": map[string]any{"cpu": "1.5"},
		"usage": map[string]any{
			"targetUtilization": map[string]any{"cpu": "60%"},
			"maxRatios":         map[string]any{"cpu": "4"},
			"window":            "1m",
			"minChange":         "5%",
		},
	})
	if _, err := dyn.Resource(ocPolicies).Create(ctx, usagePolicy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		got, err := audit.replicaRequests()
		if err != nil {
			return err
		}
		if got.openUsagePodWatches != len(in.Replicas()) || got.metricsLists < len(in.Replicas()) {
			return fmt.Errorf("after the usage policy was created: %+v", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("usage policy created: one pod watch per replica open, NodeMetrics polled (audit log) (%s)", since())

	// 1. No metrics.k8s.io yet: not synced, said so, the fallback written and counted.
	if err := waitNode(ctx, cs, node, 60*time.Second, cpuIs("6"), rawAnnotation("4")); err != nil {
		t.Fatal(err)
	}
	// The pod watch lists within moments of the policy; metrics.k8s.io is not served at all.
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		for _, r := range in.Replicas() {
			body, code, err := readyz(r)
			if err != nil {
				return err
			}
			if code != http.StatusOK || !strings.Contains(body, "usage: caches not synced (pods listed, metrics.k8s.io not read yet): the stored allocatable is kept") {
				return fmt.Errorf("replica %s /readyz before metrics.k8s.io: %d %q", r.Identity(), code, body)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := waitMetric(in, `kube_overcommit_usage_synced{cache="metrics"}`, func(v float64) bool { return v == 0 }); err != nil {
		t.Fatal(err)
	}
	if err := waitMetric(in, `kube_overcommit_usage_fallbacks_total{reason="not_synced"}`, func(v float64) bool { return v > 0 }); err != nil {
		t.Fatal(err)
	}
	t.Logf("before metrics.k8s.io: cpu 6 (fallback, not_synced), /readyz ready with the detail (%s)", since())

	// 2. Usage 20%: above raw.
	ms, err := c.StartMetricsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Stop() })
	// metrics-server scrapes every 10 s and needs two scrapes for a cpu rate.
	if err := waitNode(ctx, cs, node, 90*time.Second, cpuNear(4600, 20), rawAnnotation("4")); err != nil {
		usageDiagnostics(t, c, in)
		t.Fatal(err)
	}
	for _, r := range in.Replicas() {
		if body, _, err := readyz(r); err != nil || strings.Contains(body, "usage:") {
			t.Fatalf("replica %s /readyz once synced: %q %v", r.Identity(), body, err)
		}
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := n.Status.Allocatable[corev1.ResourceCPU]
	t.Logf("usage 20%%: cpu %s = 3 requested + 2.4 target - 0.8 used (a rate: +-20m) (%s)", got.String(), since())
	// Noisy usage: 800m +-120m (3% of raw) every 2 s; the node is read every 200 ms.
	noiseStart := time.Now()
	last := got.String()
	changes := 0
	for next := time.Now(); time.Since(noiseStart) < noise; {
		if !time.Now().Before(next) {
			setUsage(fmt.Sprintf("%dm", 680+rand.IntN(241)))
			next = time.Now().Add(2 * time.Second)
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q := n.Status.Allocatable[corev1.ResourceCPU]; q.String() != last {
			changes++
			t.Logf("noise: allocatable cpu %s -> %s after %v", last, q.String(), time.Since(noiseStart).Round(time.Second))
			last = q.String()
		}
		time.Sleep(200 * time.Millisecond)
	}
	if allowed := int((noise + time.Minute - 1) / time.Minute); changes > allowed {
		t.Fatalf("noisy usage for %v: allocatable changed %d times (at most %d: once a minute)", noise, changes, allowed)
	}
	setUsage("800m")
	t.Logf("noisy usage (+-3%%) for %v: allocatable changed %d times (%s)", noise, changes, since())

	// The scheduler places a pod that only the inflated value holds (1 cpu free at raw).
	schedulable := func(name, cpu string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"e2e-usage": "pool"}, Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.invalid/app:1",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
			}}}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	schedulable("more", "1500m")
	if err := waitScheduled(ctx, cs, ns, "more", true); err != nil {
		t.Fatal(err)
	}
	t.Logf("a 1.5-cpu pod bound to %s beside 3 requested on raw 4 (%s)", node, since())

	// 3. Usage 90%: below what raw gives, so raw; nothing more is placed, nothing evicted.
	setUsage("3600m")
	// Raw, or a value already written within minChange (5% of 4: 200m) above it, which is kept:
	// a scrape whose window spans the change reads a rate between the old and new usage, and the
	// value written from it may stand. Never below raw.
	if err := waitNode(ctx, cs, node, 60*time.Second, cpuNear(4100, 100), rawAnnotation("4")); err != nil {
		usageDiagnostics(t, c, in)
		t.Fatal(err)
	}
	schedulable("none", "100m")
	if err := waitScheduled(ctx, cs, ns, "none", false); err != nil {
		t.Fatal(err)
	}
	if err := waitScheduled(ctx, cs, ns, "more", true); err != nil {
		t.Fatal(err)
	}
	n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = n.Status.Allocatable[corev1.ResourceCPU]
	t.Logf("usage 90%%: cpu %s (raw 4, or kept within minChange above it), not below raw; 4.5 requested stays bound, a 100m pod is Unschedulable (%s)", got.String(), since())

	// 3b. Frozen kubelet metrics: metrics-server lists the node's old sample on and on; stale
	// by its own timestamp, the fallback, counted as stale; thawed, usage again.
	staleBefore, err := sumMetric(in, `kube_overcommit_usage_fallbacks_total{reason="stale"}`)
	if err != nil {
		t.Fatal(err)
	}
	freeze := func(on bool) {
		t.Helper()
		value := any(nil)
		if on {
			value = "true"
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{fakenode.FreezeAnnotation: value}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	freeze(true)
	frozen := time.Now()
	// The sample's window (10 s scrapes) + 3 polls, and up to a scrape before the freeze.
	if err := waitNode(ctx, cs, node, 60*time.Second, cpuIs("6")); err != nil {
		usageDiagnostics(t, c, in)
		t.Fatal(err)
	}
	staleAfter := time.Since(frozen)
	stamp, err := nodeMetricsTimestamp(c, node)
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(stamp); age <= 3*usagePoll {
		t.Fatalf("frozen: metrics-server lists %s at %s, only %v old", node, stamp, age)
	}
	if err := waitMetric(in, `kube_overcommit_usage_fallbacks_total{reason="stale"}`, func(v float64) bool { return v > staleBefore }); err != nil {
		t.Fatal(err)
	}
	t.Logf("frozen kubelet metrics: fallback cpu 6 %v after the freeze, counted as stale; metrics-server still lists the node, at %s (%v old) (%s)",
		staleAfter.Round(time.Millisecond), stamp.Format(time.RFC3339), time.Since(stamp).Round(time.Second), since())
	freeze(false)
	if err := waitNode(ctx, cs, node, 60*time.Second, cpuNear(4100, 100)); err != nil {
		usageDiagnostics(t, c, in)
		t.Fatal(err)
	}
	t.Logf("thawed: follows usage again (%s)", since())

	// 3c. A usage policy's ceiling raised under spec.rollout: by steps (rollout_test.go).
	checkUsageRollout(t, ctx, cs, dyn, staged)
	t.Logf("usage ceiling by steps done (%s)", since())

	// 4. metrics-server stopped: the fallback within 3 polls of the API failing, counted.
	failingBefore, err := sumMetric(in, `kube_overcommit_usage_fallbacks_total{reason="metrics_failing"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := waitMetricsAPIUnavailable(c); err != nil {
		t.Fatal(err)
	}
	failing := time.Now()
	// 3 polls, one status write (1 s), and a second for the API round trips.
	if err := waitNode(ctx, cs, node, 3*usagePoll+2*time.Second, cpuIs("6")); err != nil {
		t.Fatal(err)
	}
	t.Logf("metrics-server stopped: 503 after %v, fallback cpu 6 %v after that (3 polls: %v)",
		failing.Sub(stopped).Round(time.Millisecond), time.Since(failing).Round(time.Millisecond), 3*usagePoll)
	if err := waitMetric(in, `kube_overcommit_usage_fallbacks_total{reason="metrics_failing"}`, func(v float64) bool { return v > failingBefore }); err != nil {
		t.Fatal(err)
	}
	if err := waitMetric(in, `kube_overcommit_usage_polls_total{result="error"}`, func(v float64) bool { return v > 0 }); err != nil {
		t.Fatal(err)
	}
	for _, r := range in.Replicas() {
		if body, code, err := readyz(r); err != nil || code != http.StatusOK || !strings.Contains(body, "usage: metrics.k8s.io failing") {
			t.Fatalf("replica %s /readyz with metrics.k8s.io failing: %d %q %v", r.Identity(), code, body, err)
		}
	}

	// 5. The usage policy deleted (the static one stays): the pod watches end, the polls stop,
	// the gauges and /readyz say so.
	if err := dyn.Resource(ocPolicies).Delete(ctx, "usage-pool", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		got, err := audit.replicaRequests()
		if err != nil {
			return err
		}
		if got.openUsagePodWatches != 0 {
			return fmt.Errorf("after the usage policy was deleted: %+v", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	watchesEnded := time.Since(removed)
	for _, series := range []string{"kube_overcommit_usage_feeder_running", "kube_overcommit_usage_synced", "kube_overcommit_usage_pods"} {
		if err := waitMetric(in, series, func(v float64) bool { return v == 0 }); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range in.Replicas() {
		if body, code, err := readyz(r); err != nil || code != http.StatusOK || strings.Contains(body, "usage") {
			t.Fatalf("replica %s /readyz without usage policies: %d %q %v", r.Identity(), code, body, err)
		}
	}
	// An absence, observed over 3 polls: no NodeMetrics list after the poller stopped.
	before, err := audit.replicaRequests()
	if err != nil {
		t.Fatal(err)
	}
	observe := time.Now()
	for time.Since(observe) < 3*usagePoll {
		got, err := audit.replicaRequests()
		if err != nil {
			t.Fatal(err)
		}
		if got.metricsLists != before.metricsLists {
			t.Fatalf("usage policy deleted, yet NodeMetrics still listed: %+v then %+v", before, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("usage policy deleted: pod watches ended %v later, no NodeMetrics list over the next %v, feeders and synced gauges 0 (%s)",
		watchesEnded.Round(time.Millisecond), 3*usagePoll, since())
	t.Logf("TestUsage done in %s", since())
}

// auditLog is the API server's audit log of lists and watches of pods and of
// nodes.metrics.k8s.io.
type auditLog struct {
	path          string
	apiServerArgs []string
}

func newAuditLog(t *testing.T) *auditLog {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [list, watch]
  resources:
  - group: ""
    resources: [pods]
  - group: metrics.k8s.io
    resources: [nodes]
- level: None
`), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "audit.log")
	return &auditLog{path: path, apiServerArgs: []string{
		"--audit-policy-file=" + policy, "--audit-log-path=" + path, "--audit-log-format=json", "--audit-log-mode=blocking",
	}}
}

// replicaRequestCounts: what the replicas asked, per the audit log.
type replicaRequestCounts struct {
	// pods: lists and watches of pods by any replica client.
	pods int
	// openUsagePodWatches: pod watches of the usage task started and not yet ended.
	openUsagePodWatches int
	// metricsLists: lists of nodes.metrics.k8s.io by any replica client.
	metricsLists int
}

// replicaRequests reads the audit log: a replica's request is one from a kube-rs client (no
// User-Agent) or from the usage task's ("kube-overcommit/..."); client-go always sends one.
func (a *auditLog) replicaRequests() (replicaRequestCounts, error) {
	var out replicaRequestCounts
	f, err := os.Open(a.path)
	if err != nil {
		return out, err
	}
	defer f.Close()
	type event struct {
		AuditID   string `json:"auditID"`
		Stage     string `json:"stage"`
		Verb      string `json:"verb"`
		UserAgent string `json:"userAgent"`
		ObjectRef *struct {
			APIGroup string `json:"apiGroup"`
			Resource string `json:"resource"`
		} `json:"objectRef"`
	}
	open := map[string]bool{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for scanner.Scan() {
		var e event
		if err := json.Unmarshal(scanner.Bytes(), &e); err != nil {
			return out, fmt.Errorf("audit log line %q: %w", scanner.Text(), err)
		}
		usage := strings.HasPrefix(e.UserAgent, "kube-overcommit/")
		if e.ObjectRef == nil || (e.UserAgent != "" && !usage) {
			continue
		}
		switch {
		case e.ObjectRef.APIGroup == "" && e.ObjectRef.Resource == "pods":
			if e.Stage == "ResponseComplete" || (e.Stage == "ResponseStarted" && e.Verb != "watch") {
				out.pods++
			}
			if usage && e.Verb == "watch" {
				switch e.Stage {
				case "ResponseStarted":
					open[e.AuditID] = true
				case "ResponseComplete", "Panic":
					delete(open, e.AuditID)
				}
			}
		case e.ObjectRef.APIGroup == "metrics.k8s.io" && e.ObjectRef.Resource == "nodes" && e.Verb == "list" && e.Stage != "ResponseStarted":
			out.metricsLists++
		}
	}
	out.openUsagePodWatches = len(open)
	return out, scanner.Err()
}

// nodeMetricsTimestamp is the timestamp metrics-server lists for node.
func nodeMetricsTimestamp(c *harness.Cluster, node string) (time.Time, error) {
	out, err := c.Kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes/"+node)
	if err != nil {
		return time.Time{}, fmt.Errorf("%v: %s", err, out)
	}
	var m struct {
		Timestamp time.Time `json:"timestamp"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return time.Time{}, fmt.Errorf("%v: %s", err, out)
	}
	return m.Timestamp, nil
}

// cpuNear: allocatable cpu within tolerance millicores of want (usage is a rate over a scrape
// window, so a few millicores off the scripted value).
func cpuNear(want, tolerance int64) nodeCheck {
	return func(n *corev1.Node) error {
		got := n.Status.Allocatable[corev1.ResourceCPU]
		if d := got.MilliValue() - want; d > tolerance || d < -tolerance {
			return fmt.Errorf("allocatable cpu %s, want %dm +-%dm", got.String(), want, tolerance)
		}
		return nil
	}
}

// waitScheduled waits until the pod is bound (bound) or marked Unschedulable by the scheduler.
func waitScheduled(ctx context.Context, cs kubernetes.Interface, ns, name string, bound bool) error {
	return harness.Eventually(45*time.Second, 200*time.Millisecond, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if bound {
			if p.Spec.NodeName == "" {
				return fmt.Errorf("pod %s/%s not bound", ns, name)
			}
			return nil
		}
		if p.Spec.NodeName != "" {
			return fmt.Errorf("pod %s/%s bound to %s", ns, name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return nil
			}
		}
		return fmt.Errorf("pod %s/%s not marked Unschedulable yet", ns, name)
	})
}

// readyz is a replica's /readyz: body and status.
func readyz(r *install.Replica) (string, int, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Probe + "/readyz")
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.StatusCode, err
}

// waitMetric waits until the series summed over the replicas satisfies ok.
func waitMetric(in *install.Installation, series string, ok func(float64) bool) error {
	return harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		v, err := sumMetric(in, series)
		if err != nil {
			return err
		}
		if !ok(v) {
			return fmt.Errorf("%s = %v", series, v)
		}
		return nil
	})
}

// usageDiagnostics logs what metrics.k8s.io serves and what the replicas' usage series say.
func usageDiagnostics(t *testing.T, c *harness.Cluster, in *install.Installation) {
	t.Helper()
	out, err := c.Kubectl("get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes")
	t.Logf("metrics.k8s.io nodes: %v %s", err, out)
	for _, r := range in.Replicas() {
		m, err := replicaMetrics(r)
		for k, v := range m {
			if strings.HasPrefix(k, "kube_overcommit_usage") {
				t.Logf("replica %s: %s %v", r.Identity(), k, v)
			}
		}
		if err != nil {
			t.Logf("replica %s: %v", r.Identity(), err)
		}
	}
}

// waitMetricsAPIUnavailable waits until metrics.k8s.io answers 503 (metrics-server stopped).
func waitMetricsAPIUnavailable(c *harness.Cluster) error {
	httpClient, err := rest.HTTPClientFor(c.RestConfig)
	if err != nil {
		return err
	}
	return harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		res, err := httpClient.Get(c.Server + "/apis/metrics.k8s.io/v1beta1/nodes")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("metrics.k8s.io: %s", res.Status)
		}
		return nil
	})
}

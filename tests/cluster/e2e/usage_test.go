package e2e

// Issue 16 on the real API server: usage-aware allocatable fed by this replica's caches (a
// watch of pods, NodeMetrics listed from the real metrics-server through the aggregator every
// --usage-interval). One fake node, raw cpu 4, running a pod that requests 3 cpu; the policy
// targets 60% cpu with a ceiling of 4x and falls back to nodeRatios cpu 1.5:
//
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
//  4. metrics-server stopped: from the first 503 of metrics.k8s.io, the fallback (6 cores)
//     applies within 3 polls (plus one status write), and kube_overcommit_usage_fallbacks_total
//     {reason="metrics_failing"} counts it.

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
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
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 5*time.Minute+noise)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	in := installReplicas(t, ctx, c, append(slices.Clone(ocServeArgs), "--usage-interval="+usagePoll.String())...)
	t.Logf("installed: %s (%s)", in.Summary(), since())

	// The policy first, so that the replicas start their caches while the node comes up.
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": "usage-pool"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"e2e-usage": "pool"}},
			"nodeRatios":   map[string]any{"cpu": "1.5"},
			"usage": map[string]any{
				"targetUtilization": map[string]any{"cpu": "60%"},
				"maxRatios":         map[string]any{"cpu": "4"},
				"window":            "1m",
				"minChange":         "5%",
			},
		},
	}}
	if _, err := dyn.Resource(ocPolicies).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
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

	// 4. metrics-server stopped: the fallback within 3 polls of the API failing, counted.
	failingBefore, err := sumMetric(in, `kube_overcommit_usage_fallbacks_total{reason="metrics_failing"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	httpClient, err := rest.HTTPClientFor(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		res, err := httpClient.Get(c.Server + "/apis/metrics.k8s.io/v1beta1/nodes")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("metrics.k8s.io: %s", res.Status)
		}
		return nil
	}); err != nil {
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
	t.Logf("TestUsage done in %s", since())
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

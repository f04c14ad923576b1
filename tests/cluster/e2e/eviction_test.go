package e2e

// Issue 35 items 2 (memory relief by eviction) on the real API server: NodeMetrics and
// PodMetrics from the real metrics-server (the fake kubelet's /metrics/resource, usage scripted
// by annotations), evictions through the API server's own eviction subresource, so
// PodDisruptionBudgets are the disruption controller's. One fake node, raw memory 4Gi, policy
// spec.eviction {memoryCritical: 90%, maxPodsPerNode: 1, interval: 10s}; its pods, created in
// this order (names in the same order, so that creation-time ties break the same way):
//
//	a-base     requests 3Gi                        within raw
//	b-filler   requests 1.5Gi, priority 0          beyond raw (3Gi + 1.5Gi > 4Gi)
//	c-ds       BestEffort, priority -10, owned by a DaemonSet      never chosen
//	d-crit     BestEffort, system-node-critical                    never chosen
//	e-guarded  BestEffort, priority -5, a PDB with minAvailable 1  refused (429)
//	f-victim   BestEffort, priority 0                              the one evicted
//
// Phases: (1) dryRun: usage above 90% of raw, the leader reports "would evict" f-victim after
// the PDB refused e-guarded (the dry-run eviction is the real request with dryRun=All), and no
// pod is touched; (2) dryRun off: f-victim is evicted (deletionTimestamp set or gone, Event
// ReliefEvicted), e-guarded was refused, c-ds and d-crit never touched; (3) metrics-server
// stopped and usage raised: no eviction, relief_skipped{reason="metrics_failing"} counts.

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

func TestEviction(t *testing.T) {
	ownControlPlane(t)
	start := time.Now()
	since := func() string { return fmt.Sprintf("%.1fs", time.Since(start).Seconds()) }
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 5*time.Minute)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	in := installReplicas(t, ctx, c, append(append([]string{}, ocServeArgs...), "--usage-interval=2s")...)
	t.Logf("installed: %s (%s)", in.Summary(), since())

	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "relief", Count: 1, Args: []string{
		"--resource-metrics", "--delete-on-exit", "--cpu=4", "--memory=4Gi",
		"--labels=e2e-relief=pool", "--status-update-frequency=1s", "--status-report-frequency=3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	node := nodes.Names[0]
	if err := waitNode(ctx, cs, node, 60*time.Second, nodeReady); err != nil {
		t.Fatal(err)
	}
	setNodeUsage := func(memory string) {
		t.Helper()
		usage := fmt.Sprintf(`{"cpu":"100m","memory":%q}`, memory)
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, fakenode.UsageAnnotation, usage)
		if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setNodeUsage("1Gi")

	ns := "relief"
	ocNamespace(t, ctx, cs, ns, nil)
	createReliefPods(t, ctx, cs, ns, node)
	t.Logf("pods created on %s (%s)", node, since())

	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": "relief"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"e2e-relief": "pool"}},
			"nodeRatios":   map[string]any{"cpu": "2", "memory": "2"},
			"eviction": map[string]any{
				"memoryCritical": "90%", "maxPodsPerNode": int64(1), "interval": "10s", "dryRun": true,
			},
		},
	}}
	if _, err := dyn.Resource(ocPolicies).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	ms, err := c.StartMetricsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Stop() })

	// 1. dryRun: usage 3.9Gi outside pods (plus the pods') > 90% of 4Gi.
	setNodeUsage("3900Mi")
	if err := waitReliefEvent(ctx, cs, ns, "f-victim", "ReliefWouldEvict", 90*time.Second); err != nil {
		usageDiagnostics(t, c, in)
		t.Fatal(err)
	}
	if err := waitReliefEvent(ctx, cs, ns, "e-guarded", "ReliefEvictionRefused", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, series := range []string{`kube_overcommit_relief_evictions_total{result="dry_run"}`, `kube_overcommit_relief_evictions_total{result="refused_pdb"}`} {
		if err := waitMetric(in, series, func(v float64) bool { return v > 0 }); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := sumMetric(in, `kube_overcommit_relief_evictions_total{result="evicted"}`); err != nil || v != 0 {
		t.Fatalf("dry run: evicted = %v (%v)", v, err)
	}
	assertUntouched(t, ctx, cs, ns, "a-base", "b-filler", "c-ds", "d-crit", "e-guarded", "f-victim")
	t.Logf("1. dry run: f-victim would be evicted (e-guarded refused by its PDB), nothing evicted (%s)", since())

	// 2. dryRun off: f-victim evicted.
	patch := []byte(`{"spec":{"eviction":{"dryRun":false}}}`)
	if _, err := dyn.Resource(ocPolicies).Patch(ctx, "relief", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(60*time.Second, 200*time.Millisecond, func() error {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "f-victim", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if p.DeletionTimestamp == nil {
			return fmt.Errorf("f-victim not evicted yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	setNodeUsage("1Gi")
	if err := waitReliefEvent(ctx, cs, ns, "f-victim", "ReliefEvicted", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitMetric(in, `kube_overcommit_relief_evictions_total{result="evicted"}`, func(v float64) bool { return v >= 1 }); err != nil {
		t.Fatal(err)
	}
	assertUntouched(t, ctx, cs, ns, "a-base", "c-ds", "d-crit", "e-guarded")
	t.Logf("2. f-victim evicted (Event ReliefEvicted), e-guarded refused, c-ds (DaemonSet) and d-crit (system-node-critical) untouched (%s)", since())

	// 3. metrics-server stopped, usage raised: nothing evicted, the reason counted.
	evicted, err := sumMetric(in, `kube_overcommit_relief_evictions_total{result="evicted"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Stop(); err != nil {
		t.Fatal(err)
	}
	setNodeUsage("3900Mi")
	failing := `kube_overcommit_relief_skipped_total{reason="metrics_failing"}`
	if err := waitMetric(in, failing, func(v float64) bool { return v >= 1 }); err != nil {
		t.Fatal(err)
	}
	first, _ := sumMetric(in, failing)
	// Three more rounds (2 s each) judged without usage.
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		v, err := sumMetric(in, failing)
		if err != nil || v < first+3 {
			return fmt.Errorf("%s = %v (%v)", failing, v, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, err := sumMetric(in, `kube_overcommit_relief_evictions_total{result="evicted"}`); err != nil || v != evicted {
		t.Fatalf("metrics-server stopped: evicted went %v -> %v (%v)", evicted, v, err)
	}
	assertUntouched(t, ctx, cs, ns, "a-base", "c-ds", "d-crit", "e-guarded")
	t.Logf("3. metrics-server stopped: no eviction over 3+ rounds, metrics_failing counted (%s)", since())
}

// createReliefPods creates the priority classes, the DaemonSet owner, the PDB and the pods of
// TestEviction, in order, bound to node.
func createReliefPods(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, node string) {
	t.Helper()
	for name, value := range map[string]int32{"relief-low": -10, "relief-mid": -5} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := cs.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.SchedulingV1().PriorityClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	// A DaemonSet that places no pod (its selector matches no node): the owner of c-ds.
	labels := map[string]string{"app": "relief-ds"}
	ds, err := cs.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "relief-ds"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"e2e-relief": "none"},
					Containers:   []corev1.Container{{Name: "app", Image: "registry.example.invalid/app:1"}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &one,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}},
		},
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, usage string, mod func(*corev1.Pod)) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Annotations: map[string]string{fakenode.UsageAnnotation: fmt.Sprintf(`{"cpu":"10m","memory":%q}`, usage)}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.invalid/app:1",
			}}},
		}
		if mod != nil {
			mod(p)
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
	}
	requests := func(memory string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}
		}
	}
	pod("a-base", "100Mi", requests("3Gi"))
	pod("b-filler", "100Mi", requests("1536Mi"))
	pod("c-ds", "50Mi", func(p *corev1.Pod) {
		p.Spec.PriorityClassName = "relief-low"
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID}}
	})
	pod("d-crit", "50Mi", func(p *corev1.Pod) { p.Spec.PriorityClassName = "system-node-critical" })
	pod("e-guarded", "50Mi", func(p *corev1.Pod) {
		p.Spec.PriorityClassName = "relief-mid"
		p.Labels = map[string]string{"app": "guarded"}
	})
	pod("f-victim", "300Mi", nil)
}

// waitReliefEvent waits for an Event with reason about pod name in ns.
func waitReliefEvent(ctx context.Context, cs kubernetes.Interface, ns, name, reason string, timeout time.Duration) error {
	return harness.Eventually(timeout, 500*time.Millisecond, func() error {
		list, err := cs.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Name == name && e.Regarding.Kind == "Pod" {
				return nil
			}
			seen = append(seen, e.Reason+" "+e.Regarding.Name)
		}
		return fmt.Errorf("no Event %s on pod %s/%s; seen %v", reason, ns, name, seen)
	})
}

// assertUntouched: the pods exist and are not terminating.
func assertUntouched(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string, names ...string) {
	t.Helper()
	for _, name := range names {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if p.DeletionTimestamp != nil {
			t.Fatalf("pod %s was evicted or deleted (deletionTimestamp %v)", name, p.DeletionTimestamp)
		}
	}
}

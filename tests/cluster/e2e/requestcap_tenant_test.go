package e2e

// Issue 32, items 1 and 2, end to end on the real API server: a tenant with `create pods` only
// cannot jam a node's placement cap with creates that pass admission but are never stored, nor
// learn the node's figures from a refusal; DaemonSet and critical pods are never refused by
// the cap. One replica set and one fake kubelet serve every part (the cluster is shared).

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"kube-overcommit/tests/cluster/harness"
)

// capFigures are the node's figures for a node of raw cpu 4 under capPolicy: a refusal a
// requester reads must carry none of them.
var capFigures = []string{"of a cap of", "4.4", "110%", "would reach"}

func TestRequestCapTenantInputs(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 8*time.Minute)
	ns := uniqueName("ko-tenant")
	rs := startReplicasWithPolicy(t, ctx, ns, 1, capPolicy, "--request-cap")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	t.Run("creates that never persist hold no capacity", func(t *testing.T) { tenantCannotJam(t, ctx, rs, ns) })
	t.Run("DaemonSet and critical pods are never refused", func(t *testing.T) { exemptPodsPass(t, ctx, rs, ns) })
}

// tenantCannotJam: a node capped at 4.4 cpu holding 0.1. The tenant (1) re-creates its stored
// pod's name asking 4 cpu, 10 times (each passes the cap, then fails AlreadyExists), and (2)
// with its namespace's ResourceQuota full, creates 10 new pods asking 3 cpu each (each passes
// the cap beside the 1.1 then held, then fails on the quota). Before the fix each of those counted in the replica's
// ledger for 30 s, and every other placement on the node was refused. After each attack, at
// once, another namespace's pod asking 1 cpu is bound to the node.
func tenantCannotJam(t *testing.T, ctx context.Context, rs *replicaSet, ns string) {
	node := ns + "-jam"
	capNode(t, ctx, node, ns)
	tenant, other := ns+"-tenant", ns+"-other"
	createNamespace(t, ctx, tenant)
	createNamespace(t, ctx, other)
	waitCapCalled(t, ctx, other, "probe", node)
	tenantPods, otherPods := shared.Client.CoreV1().Pods(tenant), shared.Client.CoreV1().Pods(other)

	// What a requester reads of a refusal (a dry run too): node, resource, its pod, its ask.
	_, err := tenantPods.Create(ctx, placedPod("peek", node, "5"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	want := "node " + node + ": cpu requests would exceed the node's placement cap; pod peek asks 5"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("dry-run create over the cap: %v; want the refusal %q", err, want)
	}
	for _, figure := range capFigures {
		if strings.Contains(err.Error(), figure) {
			t.Errorf("the refusal a tenant reads shows the node's figures (%q): %v", figure, err)
		}
	}

	if _, err := tenantPods.Create(ctx, placedPod("taken", node, "100m"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The replica's index holds it: a binding of it is answered as a bound pod's (not refused
	// for want of the pod), which needs the pod in the index or one GET; wait on the index by
	// its sum instead: 0.1 + 4.4 is over the cap only once the 0.1 is counted.
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		_, err := otherPods.Create(ctx, placedPod("fill", node, "4400m"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("4.4 more still fits: the index does not count the tenant's pod yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	legit := 0
	bindLegit := func(after string) {
		t.Helper()
		legit++
		name := fmt.Sprintf("legit-%d", legit)
		if _, err := otherPods.Create(ctx, pendingPod(name, "1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := otherPods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("after %s, another namespace's binding of 1 cpu to the node (0.1 + %d of 4.4 held) was refused: %v", after, legit-1, err)
		}
		t.Logf("after %s: %s/%s (1 cpu) bound to %s", after, other, name, node)
	}

	for i := 0; i < 10; i++ {
		_, err := tenantPods.Create(ctx, placedPod("taken", node, "4"), metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("re-create of a stored pod's name: %v, want AlreadyExists (after the cap allowed it)", err)
		}
	}
	bindLegit("10 creates of a taken name asking 4 cpu (AlreadyExists)")

	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "full"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1")}}}
	if _, err := shared.Client.CoreV1().ResourceQuotas(tenant).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Quota admission needs the controller's first count of the namespace.
	if err := harness.Eventually(60*time.Second, 200*time.Millisecond, func() error {
		q, err := shared.Client.CoreV1().ResourceQuotas(tenant).Get(ctx, "full", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if used := q.Status.Used[corev1.ResourcePods]; used.Value() != 1 {
			return fmt.Errorf("quota used pods %s", used.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The first passes the cap and fails on the quota; it then holds 3 cpu against the
	// tenant's own namespace only, so the cap refuses the tenant's next ones itself.
	quotaRefused, capRefused := 0, 0
	for i := 0; i < 10; i++ {
		_, err := tenantPods.Create(ctx, placedPod(fmt.Sprintf("jam-%d", i), node, "3"), metav1.CreateOptions{})
		switch {
		case err != nil && apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
			quotaRefused++
		case err != nil && strings.Contains(err.Error(), "would exceed the node's placement cap; pod jam-"):
			capRefused++
		default:
			t.Fatalf("jam-%d in a namespace whose quota is full: %v, want the quota's or the cap's refusal", i, err)
		}
		if i == 0 && quotaRefused != 1 {
			t.Fatalf("jam-0 was not refused by the quota after the cap allowed it")
		}
	}
	t.Logf("10 creates of 3 cpu in the full namespace: %d refused by the quota (after the cap allowed them), %d by the cap for the tenant's own namespace", quotaRefused, capRefused)
	bindLegit("10 creates of new names asking 3 cpu refused by a full ResourceQuota")
}

// exemptPodsPass: a fake kubelet's node of raw cpu 4 (cap 4.4) whose allocatable an admin set
// to 8, so that the scheduler still sees room, filled to its cap. A plain pod is refused; a
// pod of priority system-cluster-critical (outside kube-system) is admitted, and a DaemonSet's
// pod is bound there by the scheduler, both counted as exempted.
func exemptPodsPass(t *testing.T, ctx context.Context, rs *replicaSet, ns string) {
	nodes := startTestNodes(t, ns+"-ds", 1, "--labels="+koNodeLabelKey+"="+ns, "--cpu=8", "--allocatable-cpu=4",
		"--status-update-frequency=10m", "--status-report-frequency=10m")
	node := nodes.Names[0]
	if err := waitNode(ctx, shared.Client, node, 60*time.Second, nodeReady); err != nil {
		t.Fatal(err)
	}
	// Raw 4 for the cap, 8 for the scheduler: an admin's writes, which no webhook reviews.
	meta := []byte(`{"metadata":{"annotations":{"` + ocRawAnnotation + `":"cpu=4"}}}`)
	if _, err := shared.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, meta, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	status := []byte(`{"status":{"allocatable":{"cpu":"8"}}}`)
	if _, err := shared.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, status, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	podNS := ns + "-agents"
	createNamespace(t, ctx, podNS)
	pods := shared.Client.CoreV1().Pods(podNS)
	waitCapCalled(t, ctx, podNS, "probe", node)
	if _, err := pods.Create(ctx, placedPod("filler", node, "4400m"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("filling the node to its cap: %v", err)
	}
	exempted := `kube_overcommit_placement_reviews_total{outcome="exempted"}`
	before, err := replicaMetrics(rs.in.Replicas()[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		_, err := pods.Create(ctx, placedPod("plain", node, "500m"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("a plain pod still fits: the filler is not counted yet")
		}
		if !strings.Contains(err.Error(), "would exceed the node's placement cap") {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("the node at its cap: %v", err)
	}

	critical := placedPod("critical", node, "500m")
	critical.Spec.PriorityClassName = "system-cluster-critical"
	if _, err := pods.Create(ctx, critical, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a system-cluster-critical pod on the node at its cap was refused: %v", err)
	}

	labels := map[string]string{"app": "agent"}
	agent := placedPod("", "", "500m").Spec
	agent.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: agent},
		}}
	if _, err := shared.Client.AppsV1().DaemonSets(podNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last string
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.Spec.NodeName == node {
				return nil
			}
			for _, c := range p.Status.Conditions {
				last = fmt.Sprintf("%s %s: %s", c.Type, c.Status, c.Message)
			}
		}
		return fmt.Errorf("the DaemonSet's pod is not bound to %s (%d pods; last condition %q)", node, len(list.Items), last)
	}); err != nil {
		t.Fatal(err)
	}
	after, err := replicaMetrics(rs.in.Replicas()[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := after[exempted] - before[exempted]; got < 2 {
		t.Errorf("%s went up by %v, want 2 (the critical pod and the DaemonSet's)", exempted, got)
	}
	t.Logf("node at its cap (4.4 of raw 4): a plain pod refused; a critical pod admitted and a DaemonSet's pod bound, %v exempted", after[exempted]-before[exempted])
}

package e2e

// Issue 19 item 4 on the real control plane: the match conditions of the webhooks the leader
// writes.
//
//  1. The node webhook sees registrations and status writes by nodes (group system:nodes) only.
//     A status write by anyone else (here a cluster admin, as node-problem-detector or a
//     controller would be) is not reviewed: a write that does not touch allocatable keeps the
//     stored, inflated value; a write that sends the kubelet's raw value is stored as sent (had
//     the webhook been called, it would have inflated it); a write that sends a value above the
//     inflated one is stored as sent too. After each, the fake kubelet's next write (as
//     system:node:<name>) inflates from the kubelet's own value again, never from what the other
//     writer left: no compounding, the raw annotation unchanged.
//  2. The pod webhook never sees mirror pods: a mirror pod created by the node's identity in a
//     namespace with pod defaults keeps its empty requests, while an ordinary pod there gets them.

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
)

func TestStatusWritersAndMirrorPods(t *testing.T) {
	ownControlPlane(t)
	c, ctx, dyn, in := startWithReplicas(t, 4*time.Minute)
	cs := c.Client
	t.Logf("installed: %s", in.Summary())

	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": "sw-cpu"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"sw": "pool"}},
			"nodeRatios":   map[string]any{"cpu": "2"},
			"podDefaults":  map[string]any{"requests": map[string]any{"cpu": "50m"}},
		},
	}}
	if _, err := dyn.Resource(ocPolicies).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "sw", Count: 1, Args: []string{
		fmt.Sprintf("--cpu=%d", ocNodeCPU), "--labels=sw=pool",
		"--status-update-frequency=1s", "--status-report-frequency=3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	node := nodes.Names[0]
	raw, inflated := fmt.Sprint(ocNodeCPU), fmt.Sprint(2*ocNodeCPU)
	if err := waitNode(ctx, cs, node, 60*time.Second, cpuIs(inflated), rawAnnotation(raw), appliedPolicy("sw-cpu")); err != nil {
		t.Fatal(err)
	}

	// 1. Status writes by a user outside system:nodes. The PATCH's answer is the object as stored.
	status := cs.CoreV1().Nodes()
	patch := func(what, body string) *corev1.Node {
		t.Helper()
		n, err := status.Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return n
	}
	cpu := func(n *corev1.Node) string {
		q := n.Status.Allocatable[corev1.ResourceCPU]
		return q.String()
	}
	stored := patch("a condition only", `{"status":{"conditions":[{"type":"ExampleProblem","status":"False","reason":"Fine","message":"written by a non-node","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`)
	if q := stored.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse(inflated)) != 0 {
		t.Errorf("a non-node status write that leaves allocatable alone stored cpu %s, want the inflated %s kept", cpu(stored), inflated)
	}
	for _, tc := range []struct{ what, sent string }{
		{"the kubelet's raw value", raw},
		{"a value above the inflated one", fmt.Sprint(4 * ocNodeCPU)},
	} {
		stored := patch(tc.what, fmt.Sprintf(`{"status":{"allocatable":{"cpu":%q}}}`, tc.sent))
		// Not reviewed: stored as sent (the webhook would have made the raw value the inflated one).
		asSent := true
		if q := stored.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse(tc.sent)) != 0 {
			asSent = false
			t.Errorf("a non-node status write of cpu %s (%s) stored cpu %s: the webhook reviewed it", tc.sent, tc.what, cpu(stored))
		}
		if err := rawAnnotation(raw)(stored); err != nil {
			t.Errorf("after a non-node write of %s: %v", tc.what, err)
		}
		// The kubelet's next write inflates from its own value: exactly raw x 2, never more.
		if err := waitNode(ctx, cs, node, 30*time.Second, cpuIs(inflated), rawAnnotation(raw), appliedPolicy("sw-cpu")); err != nil {
			t.Fatalf("after a non-node write of %s: %v", tc.what, err)
		}
		t.Logf("non-node write of cpu %s (%s) stored as sent: %v; the kubelet's next write: cpu %s from raw %s", tc.sent, tc.what, asSent, inflated, raw)
	}

	// 2. Mirror pods. The node's identity (the Node authorizer and NodeRestriction allow it a
	// mirror pod bound to itself) creates one in a namespace with pod defaults.
	ns := "sw-pods"
	ocNamespace(t, ctx, cs, ns, map[string]string{ocPodDefaultsLabel: "enabled"})
	defaulted, err := createDefaultsPod(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	if q := defaulted["plain"][corev1.ResourceCPU]; q.Cmp(resource.MustParse("50m")) != 0 {
		t.Fatalf("an ordinary pod in %s got requests %v: the pod webhook is not live there, so the mirror pod proves nothing", ns, defaulted)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mirror := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "static-web-" + node, Namespace: ns,
			Annotations: map[string]string{
				"kubernetes.io/config.mirror": "0123456789abcdef", "kubernetes.io/config.source": "file",
				"kubernetes.io/config.hash": "0123456789abcdef",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID, Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	created, err := kubeletClient(t, c.RestConfig, node).CoreV1().Pods(ns).Create(ctx, mirror, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("mirror pod as system:node:%s: %v", node, err)
	}
	if r := created.Spec.Containers[0].Resources.Requests; len(r) != 0 {
		t.Errorf("mirror pod mutated: requests %v (the pod webhook must never see mirror pods)", r)
	}
	t.Logf("ordinary pod in %s defaulted to cpu 50m; mirror pod by system:node:%s stored with requests %v", ns, node, created.Spec.Containers[0].Resources.Requests)
}

package e2e

// Issue 37, in-process mode without the webhook hop, on the real API server: once the compiled
// policy is in force the leader narrows the node webhook (its second match condition,
// served-by-webhook, the complement of what the compiled policy serves), and the API server no
// longer calls the webhook for those nodes: kubelet writes of a node a static policy serves are
// inflated in-process while the webhook's own metrics count 0 node reviews, and a node whose
// policy needs usage data is still sent to the webhook.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const hopWebhookCondition = "served-by-webhook"

func TestInProcessWebhookNotCalledForServedNodes(t *testing.T) {
	onShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, ns, rs, dyn := startInMode(t, ctx, "inhop", "--mode", "in-process")
	installCompiledObjects(t, ctx, ns, dyn)
	// A second policy, ahead of the static one, for the nodes labelled NS-usage: it needs usage
	// data, so the compiled policy leaves its nodes to the webhook.
	usageLabel := ns + "-usage"
	writeFile(t, rs.policy, mustRead(t, rs.policy)+fmt.Sprintf(`
---
apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: %s
spec:
  priority: 10
  nodeSelector:
    matchLabels:
      %s: %s
  nodeRatios:
    cpu: "2"
  usage: {targetUtilization: {cpu: "60%%"}, maxRatios: {cpu: "4"}}
`, usageLabel, koNodeLabelKey, usageLabel))

	// 1. The leader narrows the node webhook to the usage policy's nodes once the compiled
	// policy (of both policies) is in force.
	start := time.Now()
	repairedWithin(t, "node webhook narrowed", 60*time.Second, func() error {
		c, err := shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got := narrowingOf(c)
		if !strings.Contains(got, "['"+usageLabel+"']") || !strings.Contains(got, "? true") {
			return fmt.Errorf("node webhook's %s condition %q", hopWebhookCondition, got)
		}
		return nil
	})
	t.Logf("node webhook narrowed %v after start", time.Since(start).Round(time.Millisecond))

	// 2. Kubelet writes of a node the static policy serves: inflated in-process (as `review`
	// computes), and not one node review reaches the webhook.
	e := &ipEnv{t: t, ctx: ctx, bin: bin, dir: t.TempDir(), admin: shared.Client, dyn: dyn, config: shared.RestConfig, file: rs.policy}
	capacity := corev1.ResourceList{"cpu": resource.MustParse("8"), "memory": resource.MustParse("32Gi"), "pods": resource.MustParse("110")}
	raw := corev1.ResourceList{"cpu": resource.MustParse("7910m"), "memory": resource.MustParse("31Gi"), "pods": resource.MustParse("110")}
	nodeReviews := func() float64 {
		n, err := sumReviews(rs.in, func(l string) bool { return strings.Contains(l, `resource="node"`) })
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := nodeReviews()
	served := e.create(ns+"-s", map[string]string{koNodeLabelKey: ns}, nil, capacity, raw)
	e.waitInflated(served, raw)
	const writes = 5
	for i := 0; i < writes; i++ {
		e.kubelet(served, fmt.Sprintf("kubelet write %d, in-process", i+1), raw)
	}
	got := e.get(served)
	if cpu := got.Status.Allocatable.Cpu().MilliValue(); cpu != 15820 {
		t.Fatalf("served node's allocatable cpu %dm, want 15820m (7910m x 2)", cpu)
	}
	if after := nodeReviews(); after != before {
		t.Fatalf("the webhook received %v node reviews for a node served in-process (registration and %d kubelet writes), want 0", after-before, writes)
	}
	t.Logf("registration and %d kubelet writes of the served node: 0 node reviews reached the webhook", writes)

	// 3. A node under the usage policy is still sent to the webhook (its registration).
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-u", Labels: map[string]string{koNodeLabelKey: usageLabel}},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: raw},
	}
	_ = shared.Client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
	t.Cleanup(func() {
		_ = shared.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	if _, err := shared.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin(t, "usage node reviewed by the webhook", 15*time.Second, func() error {
		if n := nodeReviews(); n == before {
			return fmt.Errorf("no node review since the usage node's registration")
		}
		return nil
	})
}

// hasNodeWebhook: the configuration has the node webhook (in-process mode leaves it out while
// the compiled policy serves every node).
func hasNodeWebhook(c *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	for _, w := range c.Webhooks {
		if w.Name == "nodes.overcommit.dev" {
			return true
		}
	}
	return false
}

// narrowingOf: the node webhook's served-by-webhook condition ("" without one).
func narrowingOf(c *admissionregistrationv1.MutatingWebhookConfiguration) string {
	for _, w := range c.Webhooks {
		if w.Name != "nodes.overcommit.dev" {
			continue
		}
		for _, m := range w.MatchConditions {
			if m.Name == hopWebhookCondition {
				return m.Expression
			}
		}
	}
	return ""
}

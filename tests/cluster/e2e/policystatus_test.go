package e2e

// The status of OvercommitPolicy (issue 33, item 1), on the real API server: the leader counts
// what each policy did from the nodes' labels and their overcommit.dev/applied annotation (which
// records the policy's generation) and writes it through the status subresource; the real
// kubectl shows it in the printer columns.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/annotations"
)

const (
	psNodes = 3
	psLabel = "ps-pool"
)

// psStatus is what the test reads of a policy's status.
type psStatus struct {
	generation, observed                         int64
	selected, atGeneration, shadowed, optedOut   int64
	ready, readyReason, progressing, degradedWhy string
}

func readPolicyStatus(ctx context.Context, dyn dynamic.Interface, name string) (psStatus, error) {
	var s psStatus
	p, err := dyn.Resource(ocPolicies).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return s, err
	}
	s.generation = p.GetGeneration()
	num := func(field string) int64 {
		v, _, _ := unstructured.NestedInt64(p.Object, "status", field)
		return v
	}
	s.observed, s.selected, s.atGeneration = num("observedGeneration"), num("nodesSelected"), num("nodesAtGeneration")
	s.shadowed, s.optedOut = num("nodesShadowed"), num("nodesOptedOut")
	conditions, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
	for _, c := range conditions {
		m, _ := c.(map[string]any)
		status, _ := m["status"].(string)
		reason, _ := m["reason"].(string)
		switch m["type"] {
		case "Ready":
			s.ready, s.readyReason = status, reason
		case "Progressing":
			s.progressing = status
		case "Degraded":
			s.degradedWhy = reason
		}
	}
	return s, nil
}

// waitPolicyStatus waits until the policy's status passes check (the last status and error in
// the failure).
func waitPolicyStatus(ctx context.Context, dyn dynamic.Interface, name string, timeout time.Duration, check func(psStatus) error) (psStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		s, err := readPolicyStatus(ctx, dyn, name)
		if err == nil {
			err = check(s)
		}
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("policy %s after %s: %v (status %+v)", name, timeout, err, s)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func createPolicy(t *testing.T, ctx context.Context, dyn dynamic.Interface, name string, priority int64, selector map[string]any, ratios map[string]any) {
	t.Helper()
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"priority":     priority,
			"nodeSelector": map[string]any{"matchLabels": selector},
			"nodeRatios":   ratios,
		},
	}}
	if _, err := dyn.Resource(ocPolicies).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(ocPolicies).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func TestPolicyStatus(t *testing.T) {
	onShared(t)
	start := time.Now()
	c := shared
	ctx := harness.Context(t, 4*time.Minute)
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	in := installReplicas(t, ctx, c, ocServeArgs...)
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "ps", Count: psNodes, Args: []string{
		"--cpu=4", "--memory=8Gi", "--labels=" + psLabel + "=a",
		"--status-update-frequency=1s", "--status-report-frequency=3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	for _, n := range nodes.Names {
		if err := waitNode(ctx, c.Client, n, 60*time.Second, nodeReady); err != nil {
			t.Fatal(err)
		}
	}

	selectA := map[string]any{psLabel: "a"}
	createPolicy(t, ctx, dyn, "ps-main", 10, selectA, map[string]any{"cpu": "2"})
	createPolicy(t, ctx, dyn, "ps-low", 1, selectA, map[string]any{"cpu": "1.5"})
	createPolicy(t, ctx, dyn, "ps-none", 5, map[string]any{psLabel: "nowhere"}, map[string]any{"cpu": "2"})

	applied := func(s psStatus) error {
		switch {
		case s.observed != s.generation:
			return fmt.Errorf("observedGeneration %d, generation %d", s.observed, s.generation)
		case s.selected != psNodes || s.atGeneration != psNodes || s.shadowed != 0:
			return fmt.Errorf("selected %d, at generation %d, shadowed %d; want %d, %d, 0", s.selected, s.atGeneration, s.shadowed, psNodes, psNodes)
		case s.ready != "True" || s.readyReason != "Applied" || s.progressing != "False":
			return fmt.Errorf("Ready %s (%s), Progressing %s", s.ready, s.readyReason, s.progressing)
		}
		return nil
	}
	main, err := waitPolicyStatus(ctx, dyn, "ps-main", 90*time.Second, applied)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ps-main: %+v (%.1fs)", main, time.Since(start).Seconds())
	low, err := waitPolicyStatus(ctx, dyn, "ps-low", 30*time.Second, func(s psStatus) error {
		if s.observed != s.generation || s.selected != psNodes || s.shadowed != psNodes || s.atGeneration != 0 ||
			s.ready != "False" || s.readyReason != "AllNodesShadowed" {
			return fmt.Errorf("want %d selected, all shadowed, Ready False AllNodesShadowed", psNodes)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	none, err := waitPolicyStatus(ctx, dyn, "ps-none", 30*time.Second, func(s psStatus) error {
		if s.observed != s.generation || s.selected != 0 || s.ready != "False" || s.readyReason != "NoNodeSelected" {
			return fmt.Errorf("want 0 selected, Ready False NoNodeSelected")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ps-low: %+v; ps-none: %+v", low, none)

	// The nodes record the generation they carry.
	for _, n := range nodes.Names {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := annotations.ParseApplied(node.Annotations[annotations.Applied])
		if err != nil || a.Policy != "ps-main" || a.Generation != main.generation {
			t.Fatalf("node %s: %s=%q (%v), want ps-main at generation %d", n, annotations.Applied, node.Annotations[annotations.Applied], err, main.generation)
		}
	}

	// A spec change: a new generation, which the nodes take at their next status writes.
	patch := []byte(`{"spec":{"nodeRatios":{"cpu":"2.5"}}}`)
	if _, err := dyn.Resource(ocPolicies).Patch(ctx, "ps-main", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	changedAt := time.Now()
	main2, err := waitPolicyStatus(ctx, dyn, "ps-main", 60*time.Second, func(s psStatus) error {
		if s.generation == main.generation {
			return fmt.Errorf("generation still %d", s.generation)
		}
		return applied(s)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ps-main at generation %d on all %d nodes %.1fs after the change", main2.generation, psNodes, time.Since(changedAt).Seconds())

	// An unchanged world writes nothing: the leader's status writes over a quiet spell.
	leader := in.Leader(ctx)
	if leader == nil {
		t.Fatal("no leader")
	}
	writes := func() float64 {
		m, err := replicaMetrics(leader)
		if err != nil {
			t.Fatal(err)
		}
		return m[`kube_overcommit_policy_status_writes_total{result="written"}`]
	}
	before := writes()
	quiet := 10 * time.Second
	time.Sleep(quiet) // a measurement window, not a wait for a condition
	after := writes()
	if after != before {
		t.Errorf("%v status writes in %s with nothing changing, want 0", after-before, quiet)
	}
	t.Logf("status writes by the leader: %.0f in all, none in a quiet %s while %d nodes write status every second", after, quiet, psNodes)

	// kubectl's printer columns say the same.
	out, err := c.Kubectl("get", "overcommitpolicies", "ps-main", "ps-low", "ps-none")
	if err != nil {
		t.Fatalf("kubectl get: %v\n%s", err, out)
	}
	want := map[string][]string{
		"ps-main": {"3", "3", "0", "True", "Applied"},
		"ps-low":  {"3", "0", "3", "False", "AllNodesShadowed"},
		"ps-none": {"0", "0", "0", "False", "NoNodeSelected"},
	}
	if err := checkPrinterColumns(out, want); err != nil {
		t.Fatalf("%v in:\n%s", err, out)
	}
	t.Logf("kubectl get overcommitpolicies:\n%s", out)
}

// checkPrinterColumns finds SELECTED, AT-GEN, SHADOWED, READY and REASON in kubectl's table and
// compares each named row with want.
func checkPrinterColumns(table string, want map[string][]string) error {
	lines := strings.Split(strings.TrimSpace(table), "\n")
	header := strings.Fields(lines[0])
	index := map[string]int{}
	for i, h := range header {
		index[h] = i
	}
	columns := []string{"SELECTED", "AT-GEN", "SHADOWED", "READY", "REASON"}
	for _, col := range columns {
		if _, ok := index[col]; !ok {
			return fmt.Errorf("no column %s", col)
		}
	}
	seen := 0
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		w, ok := want[f[0]]
		if !ok || len(f) != len(header) {
			continue
		}
		seen++
		for i, col := range columns {
			if f[index[col]] != w[i] {
				return fmt.Errorf("%s: %s %s, want %s", f[0], col, f[index[col]], w[i])
			}
		}
	}
	if seen != len(want) {
		return fmt.Errorf("%d of %d rows found with %d columns", seen, len(want), len(header))
	}
	return nil
}

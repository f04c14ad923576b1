package e2e

// Issue 18, `serve --mode in-process`, on the real API server: replicas started with it keep
// the static policies compiled into a MutatingAdmissionPolicy named like the webhook
// configuration (created by the leader; the binding is the install's, applied here from
// deploy/components/in-process), rebuild it within seconds of a policy edit, repair a hand edit,
// and delete it when no static policy remains. A node status write is
// inflated by the API server while the webhook's node rule patches nothing (its "patched"
// counter stays where it was), with the same result as the webhook's rule (`review`).

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"kube-overcommit/tests/cluster/install"
)

func TestInProcessModeKeptByLeader(t *testing.T) {
	bin, err := install.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(shared.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := uniqueName("inmode")
	rs := startReplicasWithPolicy(t, ctx, ns, 2, "  nodeRatios:\n    cpu: \"2\"\n", "--mode", "in-process", "--policy-reload-interval", "1s")
	t.Cleanup(func() {
		bg := context.Background()
		_ = dyn.Resource(mabGVR).Delete(bg, ns, metav1.DeleteOptions{})
		_ = dyn.Resource(mapGVR).Delete(bg, ns, metav1.DeleteOptions{})
	})
	if err := rs.in.WaitBootstrapped(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	policies, bindings := dyn.Resource(mapGVR), dyn.Resource(mabGVR)
	// The binding is the install's (deploy/components/in-process), never the leader's.
	shipped, err := install.InProcessBinding(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bindings.Create(ctx, shipped, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	get := func() (*unstructured.Unstructured, *unstructured.Unstructured, error) {
		p, err := policies.Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return nil, nil, err
		}
		b, err := bindings.Get(ctx, ns, metav1.GetOptions{})
		return p, b, err
	}
	cpuRatio := func(p *unstructured.Unstructured) string {
		vars, _, _ := unstructured.NestedSlice(p.Object, "spec", "variables")
		for _, v := range vars {
			if m, ok := v.(map[string]any); ok && m["name"] == "ratios" {
				return fmt.Sprint(m["expression"])
			}
		}
		return ""
	}

	// 1. The leader creates the policy, labelled, the one the shipped binding names.
	repairedWithin(t, "compiled policy created", 30*time.Second, func() error {
		p, b, err := get()
		if err != nil {
			return err
		}
		if p.GetLabels()["app.kubernetes.io/managed-by"] != "kube-overcommit" {
			return fmt.Errorf("labels %v", p.GetLabels())
		}
		if name, _, _ := unstructured.NestedString(b.Object, "spec", "policyName"); name != ns {
			return fmt.Errorf("binding policyName %q", name)
		}
		if !strings.Contains(cpuRatio(p), "'cpu': 2000000") {
			return fmt.Errorf("ratios %s", cpuRatio(p))
		}
		return nil
	})

	// 2. A node status write is inflated by the API server; the webhook patches nothing.
	e := &ipEnv{t: t, ctx: ctx, bin: bin, dir: t.TempDir(), admin: shared.Client, dyn: dyn, config: shared.RestConfig, file: rs.policy}
	capacity := corev1.ResourceList{"cpu": resource.MustParse("8"), "memory": resource.MustParse("32Gi"), "pods": resource.MustParse("110")}
	raw := corev1.ResourceList{"cpu": resource.MustParse("7910m"), "memory": resource.MustParse("31Gi"), "pods": resource.MustParse("110")}
	node := e.create(ns+"-n1", map[string]string{koNodeLabelKey: ns}, nil, capacity, raw)
	patched := func() float64 { return nodePatches(t, rs.in) }
	// The replicas step back once the compiled policy has been in force for a few seconds:
	// kubelet writes until one is inflated without a webhook patch.
	deadline := time.Now().Add(45 * time.Second)
	for {
		before := patched()
		got, want := e.apply(node, raw)
		diff := compareNodes(got, want)
		if diff == "" && patched() == before && got.Status.Allocatable.Cpu().MilliValue() == 15820 {
			t.Logf("inflated in-process, no webhook patch: %v %v", canonical(got.Status.Allocatable), ours(got.Annotations))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no in-process inflation without a webhook patch within 45s: %s (patched %v -> %v)", diff, before, patched())
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.kubelet(node, "heartbeat, in-process (never compounds)", raw)

	// 3. A policy edit reaches the compiled policy within seconds, then the nodes.
	edited := strings.Replace(mustRead(t, rs.policy), `cpu: "2"`, `cpu: "3"`, 1)
	writeFile(t, rs.policy, edited)
	start := time.Now()
	repairedWithin(t, "policy edit compiled", 15*time.Second, func() error {
		p, _, err := get()
		if err != nil {
			return err
		}
		if !strings.Contains(cpuRatio(p), "'cpu': 3000000") {
			return fmt.Errorf("ratios %s", cpuRatio(p))
		}
		return nil
	})
	t.Logf("policy edit compiled in %v", time.Since(start).Round(time.Millisecond))
	e.untilMatches(node, "ratio 3 in-process", raw)

	// 4. A hand edit of the compiled policy is repaired.
	p, _, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(p.Object, "Fail", "spec", "failurePolicy"); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	repairedWithin(t, "hand edit repaired", 15*time.Second, func() error {
		p, _, err := get()
		if err != nil {
			return err
		}
		if fp, _, _ := unstructured.NestedString(p.Object, "spec", "failurePolicy"); fp != "Ignore" {
			return fmt.Errorf("failurePolicy %q", fp)
		}
		return nil
	})
	t.Logf("hand edit repaired in %v", time.Since(start).Round(time.Millisecond))
	// Exactly two replaces so far (the policy edit, the hand edit): what the API server
	// defaults is not taken for drift, so nothing is rewritten at every resync.
	if err := rs.in.WaitReady(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	repairs := func() float64 {
		var n float64
		for _, r := range rs.in.Replicas() {
			m, err := replicaMetrics(r)
			if err != nil {
				t.Fatal(err)
			}
			n += m[`kube_overcommit_config_repairs_total{object="mutating-admission-policy",action="repaired"}`]
		}
		return n
	}
	first := repairs()
	// Two resyncs of the leader loop (5 s at most each) without a write.
	resync := time.NewTimer(6 * time.Second)
	<-resync.C
	if n := repairs(); n != 2 || first != 2 {
		t.Fatalf("compiled policy replaced %v then %v times, want 2 (policy edit, hand edit): drift taken where there is none", first, n)
	}

	// 5. No static policy left (a usage policy only): the policy is deleted (the binding, the
	// install's, stays), and the webhook serves the node again.
	writeFile(t, rs.policy, strings.Replace(edited, "  nodeRatios:\n", "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n  nodeRatios:\n", 1))
	repairedWithin(t, "compiled policy deleted", 15*time.Second, func() error {
		_, err := policies.Get(ctx, ns, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("policy still there: %v", err)
		}
		if _, err = bindings.Get(ctx, ns, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("the install's binding is gone: %v", err)
		}
		return nil
	})
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	// Written beside and renamed, so that a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

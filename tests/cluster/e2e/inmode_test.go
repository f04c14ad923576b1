package e2e

// Issue 18, `serve --mode in-process`, on the real API server: replicas started with it keep
// the static policies compiled into the MutatingAdmissionPolicy named like the webhook
// configuration, which the install ships as a placeholder (deploy/components/in-process, applied
// here with its binding): the leader fills it in, rebuilds it within seconds of a policy edit,
// repairs a hand edit, puts the placeholder back when no static policy remains, and never
// creates one that is missing (the ServiceAccount cannot: issue 32). A node status write is
// inflated by the API server while the webhook's node rule patches nothing (its "patched"
// counter stays where it was), with the same result as the webhook's rule (`review`). With
// `--in-process-policy operator` the leader writes nothing: an operator-applied policy compiled
// from older policies leaves the nodes to the webhook.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"kube-overcommit/tests/cluster/install"
)

// startInMode: the binary, two replicas of a policy of cpu x2 started with `extra`, and a
// dynamic client; the compiled objects named after the namespace are deleted at the end.
func startInMode(t *testing.T, ctx context.Context, prefix string, extra ...string) (string, string, *replicaSet, dynamic.Interface) {
	t.Helper()
	bin, err := install.Binary()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(shared.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := uniqueName(prefix)
	rs := startReplicasWithPolicy(t, ctx, ns, 2, "  nodeRatios:\n    cpu: \"2\"\n", append([]string{"--policy-reload-interval", "1s"}, extra...)...)
	t.Cleanup(func() {
		bg := context.Background()
		_ = dyn.Resource(mabGVR).Delete(bg, ns, metav1.DeleteOptions{})
		_ = dyn.Resource(mapGVR).Delete(bg, ns, metav1.DeleteOptions{})
	})
	if err := rs.in.WaitBootstrapped(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	return bin, ns, rs, dyn
}

func TestInProcessModeKeptByLeader(t *testing.T) {
	onShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, ns, rs, dyn := startInMode(t, ctx, "inmode", "--mode", "in-process")
	policies, bindings := dyn.Resource(mapGVR), dyn.Resource(mabGVR)
	placeholder := installCompiledObjects(t, ctx, ns, dyn)
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

	// 1. The leader fills in the placeholder, labelled, the one the shipped binding names.
	repairedWithin(t, "placeholder filled in", 30*time.Second, func() error {
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
	ratio3 := func() error {
		p, _, err := get()
		if err != nil {
			return err
		}
		if !strings.Contains(cpuRatio(p), "'cpu': 3000000") {
			return fmt.Errorf("ratios %s", cpuRatio(p))
		}
		return nil
	}
	repairedWithin(t, "policy edit compiled", 15*time.Second, ratio3)
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
	// Exactly three replaces so far (the placeholder filled in, the policy edit, the hand
	// edit): what the API server defaults is not taken for drift, so nothing is rewritten at
	// every resync.
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
	if n := repairs(); n != 3 || first != 3 {
		t.Fatalf("compiled policy replaced %v then %v times, want 3 (placeholder filled in, policy edit, hand edit): drift taken where there is none", first, n)
	}

	// 5. No static policy left (a usage policy only): the placeholder is put back (the object
	// stays, so that a static policy can be compiled into it again; the binding, the
	// install's, stays too), and the webhook serves the node again.
	writeFile(t, rs.policy, strings.Replace(edited, "  nodeRatios:\n", "  usage: {targetUtilization: {cpu: \"60%\"}, maxRatios: {cpu: \"4\"}}\n  nodeRatios:\n", 1))
	repairedWithin(t, "placeholder put back", 15*time.Second, func() error {
		p, _, err := get()
		if err != nil {
			return err
		}
		if !isPlaceholder(p) {
			return fmt.Errorf("policy spec %v", p.Object["spec"])
		}
		return nil
	})

	// 6. A missing policy is never created (the ServiceAccount has no create): with a static
	// policy again and the policy deleted, the leader says so and the object stays absent; the
	// install's placeholder, applied again, is filled in.
	const missing = "the MutatingAdmissionPolicy of the compiled policy is missing"
	reports := func() int {
		n := 0
		for _, r := range rs.in.Replicas() {
			n += logCount(r.LogPath, missing)
		}
		return n
	}
	before := reports()
	writeFile(t, rs.policy, edited)
	if err := policies.Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin(t, "the leader reports the missing policy", 30*time.Second, func() error {
		if reports() == before {
			return fmt.Errorf("no replica logged the missing policy since the delete")
		}
		return nil
	})
	if _, err := policies.Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the missing policy was created again (or cannot be read): %v", err)
	}
	if _, err := policies.Create(ctx, placeholder.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin(t, "placeholder applied again, filled in", 30*time.Second, ratio3)
}

// installCompiledObjects creates both objects as the install ships them
// (deploy/components/in-process): the policy as the placeholder the leader fills in (returned),
// the binding never written by it.
func installCompiledObjects(t *testing.T, ctx context.Context, ns string, dyn dynamic.Interface) *unstructured.Unstructured {
	t.Helper()
	placeholder, err := install.InProcessPolicy(ns)
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := install.InProcessBinding(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(mapGVR).Create(ctx, placeholder.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(mabGVR).Create(ctx, shipped, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return placeholder
}

// isPlaceholder: the policy is the one deploy/components/in-process ships (its only match
// condition is always false: it changes no write).
func isPlaceholder(p *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(p.Object, "spec", "matchConditions")
	vars, _, _ := unstructured.NestedSlice(p.Object, "spec", "variables")
	if len(conds) != 1 || len(vars) != 0 {
		return false
	}
	c, ok := conds[0].(map[string]any)
	return ok && c["expression"] == "false"
}

// logSince reports whether a replica's log has `text` since its last start.
func logSince(logPath, text string) bool {
	return logCount(logPath, text) > 0
}

// logCount: how many times a replica's log has `text` since its last start.
func logCount(logPath, text string) int {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	log := string(data)
	if i := strings.LastIndex(log, "---- install: starting"); i >= 0 {
		log = log[i:]
	}
	return strings.Count(log, text)
}

// TestInProcessOperatorApplied: `--in-process-policy operator` on the real API server (the
// replicas run as a cluster admin here, so nothing but the code keeps them from writing). The
// leader creates nothing; the operator applies `compile-inprocess`'s output and every replica
// leaves the nodes to it; a policy edit makes the applied policy stale: the leader reports the
// fields that differ and writes nothing (same resourceVersion), every replica serves the nodes
// through the webhook again (kube_overcommit_in_process_in_force 0) until the operator applies
// the new output.
func TestInProcessOperatorApplied(t *testing.T) {
	onShared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, ns, rs, dyn := startInMode(t, ctx, "inoper", "--mode", "in-process", "--in-process-policy", "operator")
	policies := dyn.Resource(mapGVR)
	leaderLogs := func(text string) error {
		for _, r := range rs.in.Replicas() {
			if logSince(r.LogPath, text) {
				return nil
			}
		}
		return fmt.Errorf("no replica logged %q", text)
	}
	inForce := func(want float64) error {
		for _, r := range rs.in.Replicas() {
			m, err := replicaMetrics(r)
			if err != nil {
				return err
			}
			if got := m["kube_overcommit_in_process_in_force"]; got != want {
				return fmt.Errorf("%s: in_process_in_force %v, want %v", r.Identity(), got, want)
			}
		}
		return nil
	}
	// apply is the operator: compile-inprocess of the policy file, applied as it is.
	apply := func() {
		t.Helper()
		out, err := exec.Command(bin, "compile-inprocess", "--policy-file", rs.policy, "--webhook-config-name", ns, "--namespace", ns).Output()
		if err != nil {
			t.Fatalf("compile-inprocess: %v", err)
		}
		var list struct {
			Items []map[string]any `json:"items"`
		}
		if err := json.Unmarshal(out, &list); err != nil || len(list.Items) != 2 {
			t.Fatalf("compile-inprocess output: %v %s", err, out)
		}
		for i, gvr := range []schema.GroupVersionResource{mapGVR, mabGVR} {
			obj := &unstructured.Unstructured{Object: list.Items[i]}
			if _, err := dyn.Resource(gvr).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "operator", Force: true}); err != nil {
				t.Fatalf("applying %s: %v", gvr.Resource, err)
			}
		}
	}

	// 1. Nothing applied yet: the leader reports the missing policy and creates nothing.
	repairedWithin(t, "missing policy reported", 30*time.Second, func() error {
		return leaderLogs("the MutatingAdmissionPolicy of the compiled policy is missing")
	})
	if _, err := policies.Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the leader created the policy with --in-process-policy operator (or it cannot be read): %v", err)
	}
	if err := inForce(0); err != nil {
		t.Fatal(err)
	}

	// 2. Applied by the operator: every replica leaves the nodes to it.
	apply()
	repairedWithin(t, "every replica steps back", 30*time.Second, func() error { return inForce(1) })

	// 3. A policy edit: the applied policy is stale. The webhook serves again, the leader says
	// what differs, and nothing is written.
	before, err := policies.Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, rs.policy, strings.Replace(mustRead(t, rs.policy), `cpu: "2"`, `cpu: "3"`, 1))
	repairedWithin(t, "every replica serves the nodes again", 30*time.Second, func() error { return inForce(0) })
	repairedWithin(t, "stale policy reported", 30*time.Second, func() error {
		return leaderLogs("the MutatingAdmissionPolicy of the compiled policy differs from what the policies in force compile to")
	})
	after, err := policies.Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetResourceVersion() != before.GetResourceVersion() {
		t.Fatalf("the leader wrote the operator's policy (resourceVersion %s -> %s)", before.GetResourceVersion(), after.GetResourceVersion())
	}

	// 4. Compiled and applied again: in force again.
	apply()
	repairedWithin(t, "every replica steps back again", 30*time.Second, func() error { return inForce(1) })
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

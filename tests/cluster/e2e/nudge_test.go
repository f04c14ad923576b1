package e2e

// Issue 33 item 3 on the real control plane: a policy change reaches every affected node within
// 30 s, including nodes whose kubelet writes status only every 5 minutes (the leader's nudges,
// src/leader/nudger.rs), and the node guard (deploy/components/webhook-guard/node-guard.yaml)
// lets the ServiceAccount's node writes change nothing but allocatable and the two overcommit
// annotations.
//
// TestNudgeReachesQuietNodes: the replicas run as the ServiceAccount (impersonated) under the
// manifests' own RBAC (deploy/base/rbac.yaml) and both guards (deploy/components/webhook-guard),
// and fake kubelets sync status every 5 minutes (--status-update-frequency=5m, as a kubelet with
// unchanged status reports). Each trigger is timed until every affected node shows it: policy
// created, ratio changed, a node relabelled out and back in, a node opted out, the policy
// deleted (restored to raw, annotations gone).
//
// TestNudgeReachesHollowNodes: the same on hollow kubelets (Kubernetes' own kubelet code) with
// their default rhythm (status computed every 10 s, written when it changed or every 5 min).
//
// TestNodeGuard: as the ServiceAccount (with system:masters, so that only the guard can refuse),
// every node change but allocatable and the two annotations is refused by the guard, and the
// nudge, and a write of allocatable and the two annotations, are accepted.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

const (
	// The ServiceAccount of deploy/ (the user the match conditions and the guards name).
	nudgeUser = "system:serviceaccount:kube-overcommit:kube-overcommit"
	// The promise of issue 33: a change reaches every affected node within this.
	nudgeDeadline = 30 * time.Second
)

// asServiceAccount is the admin config acting as the ServiceAccount, in `groups` too.
func asServiceAccount(admin *rest.Config, groups ...string) *rest.Config {
	config := rest.CopyConfig(admin)
	config.Impersonate = rest.ImpersonationConfig{UserName: nudgeUser, Groups: append(groups, "system:authenticated")}
	return config
}

// applyManifests server-side applies files of deploy/ as the admin.
func applyManifests(t *testing.T, c *harness.Cluster, files ...string) {
	t.Helper()
	for _, f := range files {
		path := filepath.Join(install.RepoRoot(), f)
		if out, err := c.Kubectl("apply", "--server-side", "-f", path); err != nil {
			t.Fatalf("apply %s: %v\n%s", f, err, out)
		}
	}
}

func TestNudgeReachesQuietNodes(t *testing.T) {
	ownControlPlane(t)
	nudgeQuietNodes(t, nil, nil, false)
}

// TestNudgeReachesHollowNodes: the same on Kubernetes' own kubelet (kubemark's hollow kubelet,
// tests/cluster README "Hollow nodes") with its defaults: status computed every 10 s, written
// when it changed or every 5 min.
func TestNudgeReachesHollowNodes(t *testing.T) {
	ownControlPlane(t)
	nudgeQuietNodes(t, nil, nil, true)
}

// TestNudgeReachesQuietNodesInProcess: the same with `--mode=in-process` (the compiled policy
// applies the static policy, the webhook's node rule steps back for its nodes). The relabel and
// opt-out steps run while every replica reports the compiled policy in force: then only the
// compiled policy, whose match condition must take the ServiceAccount's writes, can change the
// nodes.
func TestNudgeReachesQuietNodesInProcess(t *testing.T) {
	ownControlPlane(t)
	nudgeQuietNodes(t, []string{"--mode=in-process"}, []string{
		"deploy/components/in-process/rbac.yaml",
		"deploy/components/in-process/policy.yaml",
		"deploy/components/in-process/binding.yaml",
	}, false)
}

// waitInForce waits until every replica reports the compiled policy in force.
func waitInForce(in *install.Installation) error {
	return harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		for _, r := range in.Replicas() {
			m, err := replicaMetrics(r)
			if err != nil {
				return err
			}
			if m["kube_overcommit_in_process_in_force"] != 1 {
				return fmt.Errorf("replica %s: the compiled policy is not in force", r.Identity())
			}
		}
		return nil
	})
}

// installAsServiceAccount installs 2 replicas (ocServeArgs and args) acting as the
// ServiceAccount under the manifests' own RBAC and both guards (and manifests), and waits until
// they are bootstrapped; their logs are shown when the test failed.
func installAsServiceAccount(t *testing.T, ctx context.Context, c *harness.Cluster, args []string, manifests ...string) *install.Installation {
	t.Helper()
	ocNamespace(t, ctx, c.Client, install.DefaultNamespace, nil)
	applyManifests(t, c, "deploy/base/rbac.yaml",
		"deploy/components/webhook-guard/validatingadmissionpolicy.yaml",
		"deploy/components/webhook-guard/node-guard.yaml")
	applyManifests(t, c, manifests...)
	in, err := install.Install(ctx, c, install.Options{
		Replicas: 2, CRD: install.DefaultCRD(), SecretDelay: time.Second,
		Args: append(append([]string{}, ocServeArgs...), args...),
		// kube-rs's impersonation: the replicas are the ServiceAccount, under its RBAC only.
		Env: []string{
			"KUBE_RS_DEBUG_IMPERSONATE_USER=" + nudgeUser,
			"KUBE_RS_DEBUG_IMPERSONATE_GROUP=system:serviceaccounts,system:serviceaccounts:kube-overcommit,system:authenticated",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range in.LogPaths() {
				tailLog(t, p, 60)
			}
		}
		_ = in.Uninstall(context.Background(), false)
	})
	if err := in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return in
}

// startQuietHollow starts count hollow kubelets of ocNodeCPU cpu labelled label, with the
// kubelet's default rhythm (status computed every 10 s, written when it changed or every
// 5 min), waits until they are Ready and returns their names.
func startQuietHollow(t *testing.T, ctx context.Context, c *harness.Cluster, prefix string, count int, label string) []string {
	t.Helper()
	h, err := c.StartHollowNodes(harness.HollowNodesOptions{Prefix: prefix, Count: count, Args: []string{
		fmt.Sprintf("--cpu=%d", ocNodeCPU), "--memory=8Gi", "--labels=" + label,
		"--status-update-frequency=10s", "--status-report-frequency=5m",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Stop() })
	if err := h.WaitReady(ctx, 4*time.Minute); err != nil {
		t.Fatal(err)
	}
	return h.Names
}

func nudgeQuietNodes(t *testing.T, args, manifests []string, hollow bool) {
	inProcess := len(manifests) > 0
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 8*time.Minute)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	in := installAsServiceAccount(t, ctx, c, args, manifests...)

	var nodes *harness.FakeNodes
	var names []string
	if hollow {
		names = startQuietHollow(t, ctx, c, "quiet", 3, "nudge=pool")
	} else {
		nodes, err = c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "quiet", Count: 3, Args: []string{
			fmt.Sprintf("--cpu=%d", ocNodeCPU), "--labels=nudge=pool",
			"--status-update-frequency=5m", "--status-report-frequency=5m",
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nodes.Stop() })
		names = nodes.Names
	}
	raw := fmt.Sprint(ocNodeCPU)
	for _, n := range names {
		if err := waitNode(ctx, cs, n, 60*time.Second, nodeReady, cpuIs(raw), notAnnotated); err != nil {
			t.Fatal(err)
		}
	}
	var writesBefore int64
	if !hollow {
		writesBefore = kubeletWrites(t, nodes)
	}

	// Each step: a change, and what every node must show within the deadline.
	policy := func(ratio string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "overcommit.dev/v1alpha1", "kind": "OvercommitPolicy",
			"metadata": map[string]any{"name": "nudged"},
			"spec": map[string]any{
				"nodeSelector": map[string]any{"matchLabels": map[string]any{"nudge": "pool"}},
				"nodeRatios":   map[string]any{"cpu": ratio},
			},
		}}
	}
	inflated := func(times int) []nodeCheck {
		return []nodeCheck{cpuIs(fmt.Sprint(times * ocNodeCPU)), rawAnnotation(raw), appliedPolicy("nudged")}
	}
	restored := []nodeCheck{cpuIs(raw), notAnnotated}
	label := func(node, kv string) func() error {
		return func() error {
			_, err := c.Kubectl("label", "node", node, kv, "--overwrite")
			return err
		}
	}
	policies := dyn.Resource(ocPolicies)
	q0, q1, q2 := names[0], names[1], names[2]
	steps := []struct {
		name   string
		change func() error
		want   map[string][]nodeCheck
	}{
		{"policy created (cpu x2)", func() error {
			_, err := policies.Create(ctx, policy("2"), metav1.CreateOptions{})
			return err
		}, map[string][]nodeCheck{q0: inflated(2), q1: inflated(2), q2: inflated(2)}},
		{"ratio changed (cpu x3)", func() error {
			p, err := policies.Get(ctx, "nudged", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(p.Object, "3", "spec", "nodeRatios", "cpu"); err != nil {
				return err
			}
			_, err = policies.Update(ctx, p, metav1.UpdateOptions{})
			return err
		}, map[string][]nodeCheck{q0: inflated(3), q1: inflated(3), q2: inflated(3)}},
		{"node relabelled out", label(q0, "nudge=other"), map[string][]nodeCheck{q0: restored, q1: inflated(3)}},
		{"node relabelled in", label(q0, "nudge=pool"), map[string][]nodeCheck{q0: inflated(3)}},
		{"node opted out", label(q1, ocDisabledLabel+"=true"), map[string][]nodeCheck{q1: restored, q0: inflated(3)}},
		{"policy deleted", func() error {
			return policies.Delete(ctx, "nudged", metav1.DeleteOptions{})
		}, map[string][]nodeCheck{q0: restored, q1: restored, q2: restored}},
	}
	// The webhook's patched node reviews: in-process, none during the relabel and opt-out steps.
	nodePatches := func() float64 {
		n, err := sumReviews(in, func(l string) bool {
			return strings.Contains(l, `resource="node"`) && strings.Contains(l, `outcome="patched"`)
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var patchedBefore float64
	for i, step := range steps {
		if inProcess && i == 2 {
			patchedBefore = nodePatches()
		}
		if inProcess && i == len(steps)-1 {
			if after := nodePatches(); after != patchedBefore {
				t.Errorf("the webhook patched %v node reviews during the relabel and opt-out steps: the compiled policy should have served every nudge", after-patchedBefore)
			}
		}
		// In-process: from the relabels on, no policy changes, so the compiled policy stays in
		// force through each step (checked before and after).
		if inProcess && i >= 2 && i < len(steps)-1 {
			if err := waitInForce(in); err != nil {
				t.Fatalf("before %s: %v", step.name, err)
			}
		}
		start := time.Now()
		if err := step.change(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for node, checks := range step.want {
			left := nudgeDeadline - time.Since(start)
			if err := waitNode(ctx, cs, node, left, checks...); err != nil {
				t.Fatalf("%s: not on %s within %s: %v", step.name, node, nudgeDeadline, err)
			}
		}
		t.Logf("%s: every affected node shows it %.1f s after the change", step.name, time.Since(start).Seconds())
		if i == 1 {
			checkPolicyEvents(t, c, "nudged", len(names))
		}
		if inProcess && i >= 2 && i < len(steps)-1 {
			if err := waitInForce(in); err != nil {
				t.Fatalf("after %s: %v", step.name, err)
			}
		}
	}
	if !hollow {
		t.Logf("kubelet status writes during the steps: %d (before: %d); each node syncs every 5 min",
			kubeletWrites(t, nodes), writesBefore)
	}

	// The leader's metrics: nudges sent, none failed, the lag observed, nothing out of date.
	err = harness.Eventually(15*time.Second, 200*time.Millisecond, func() error {
		leader := in.Leader(ctx)
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		m, err := replicaMetrics(leader)
		if err != nil {
			return err
		}
		sent, failed := m[`kube_overcommit_nudges_total{result="sent"}`], m[`kube_overcommit_nudges_total{result="failed"}`]
		lag, out := m["kube_overcommit_nudge_lag_seconds_count"], m["kube_overcommit_nodes_out_of_date"]
		t.Logf("leader: nudges sent %v, failed %v; lag observed %v times; out of date %v", sent, failed, lag, out)
		if sent < 10 || failed != 0 || lag < 10 || out != 0 {
			return fmt.Errorf("nudges sent %v (want >= 10: one per node per step), failed %v, lag count %v, out of date %v", sent, failed, lag, out)
		}
		return checkEventsWritten(t, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	checkNodeEvents(t, c, q0, "nudged")
}

// kubeletWrites is the fake kubelets' status write attempts so far.
func kubeletWrites(t *testing.T, nodes *harness.FakeNodes) int64 {
	t.Helper()
	s, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s.StatusWrites.Attempts
}

func TestNodeGuard(t *testing.T) {
	ownControlPlane(t)
	c := harness.Start(t, harness.Options{Nodes: 1})
	ctx := harness.Context(t, 3*time.Minute)
	applyManifests(t, c, "deploy/components/webhook-guard/node-guard.yaml")
	sa, err := kubernetes.NewForConfig(asServiceAccount(c.RestConfig, "system:masters"))
	if err != nil {
		t.Fatal(err)
	}
	node := "node-0"
	get := func() *corev1.Node {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	statusPatch := func(body string) error {
		_, err := sa.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		return err
	}
	mergePatch := func(body string) error {
		_, err := sa.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	byGuard := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "kube-overcommit-node-guard")
	}
	// The policy takes effect once the API server has loaded it: wait for the first refusal
	// (a new label value each time: an unchanged node passes).
	probe := 0
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		probe++
		if err := statusPatch(fmt.Sprintf(`{"metadata":{"labels":{"guard-probe":"%d"}}}`, probe)); !byGuard(err) {
			return fmt.Errorf("a label write by the ServiceAccount was not refused by the guard: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	n := get()
	addr, _ := json.Marshal(append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "127.0.0.9"}))
	refused := []struct{ name, body string }{
		{"capacity", `{"status":{"capacity":{"cpu":"64"}}}`},
		{"conditions", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Guard","message":"x"}]}}`},
		{"addresses", `{"status":{"addresses":` + string(addr) + `}}`},
		{"nodeInfo", `{"status":{"nodeInfo":{"kubeletVersion":"v0.0.1"}}}`},
		{"images", `{"status":{"images":[{"names":["guard/x:1"],"sizeBytes":1}]}}`},
		{"volumesInUse", `{"status":{"volumesInUse":["kubernetes.io/csi/guard^x"]}}`},
		{"daemonEndpoints", `{"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":1}}}}`},
		{"phase", `{"status":{"phase":"Terminated"}}`},
		{"labels", `{"metadata":{"labels":{"guard":"x"}}}`},
		{"a label removed", `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`},
		{"another annotation", `{"metadata":{"annotations":{"guard.io/x":"y"}}}`},
		{"ownerReferences", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Namespace","name":"default","uid":"00000000-0000-0000-0000-000000000001"}]}}`},
		{"finalizers", `{"metadata":{"finalizers":["guard.io/x"]}}`},
		{"allocatable with capacity", `{"status":{"allocatable":{"cpu":"9"},"capacity":{"cpu":"9"}}}`},
	}
	for _, r := range refused {
		if err := statusPatch(r.body); !byGuard(err) {
			t.Errorf("status write changing %s: want refused by kube-overcommit-node-guard, got %v", r.name, err)
		}
	}
	// Writes of the node itself changing more than the pressure taint (another taint,
	// unschedulable, providerID, our taint with another effect), its creation and deletion:
	// refused.
	for name, write := range map[string]func() error{
		"another taint": func() error { return mergePatch(`{"spec":{"taints":[{"key":"guard","effect":"NoSchedule"}]}}`) },
		"another taint with ours": func() error {
			return mergePatch(`{"spec":{"taints":[{"key":"guard","effect":"NoSchedule"},{"key":"overcommit.dev/pressure","value":"cpu","effect":"NoSchedule"}]}}`)
		},
		"our taint, NoExecute": func() error {
			return mergePatch(`{"spec":{"taints":[{"key":"overcommit.dev/pressure","value":"cpu","effect":"NoExecute"}]}}`)
		},
		"unschedulable": func() error { return mergePatch(`{"spec":{"unschedulable":true}}`) },
		"providerID":    func() error { return mergePatch(`{"spec":{"providerID":"guard://x"}}`) },
		"delete": func() error {
			return sa.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		},
		"create": func() error {
			_, err := sa.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "guard-made"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		},
	} {
		if err := write(); !byGuard(err) {
			t.Errorf("%s by the ServiceAccount: want refused by kube-overcommit-node-guard, got %v", name, err)
		}
	}
	// Spec through the status subresource: the API server drops it (nodes/status resets spec).
	if err := statusPatch(`{"spec":{"unschedulable":true}}`); err != nil && !byGuard(err) {
		t.Errorf("spec through status: %v", err)
	}
	if after := get(); after.Spec.Unschedulable || len(after.Labels) != len(n.Labels) {
		t.Errorf("the node changed: unschedulable %v, labels %v (before %v)", after.Spec.Unschedulable, after.Labels, n.Labels)
	}

	// Accepted: the nudge, and what the node webhook writes into it.
	if err := statusPatch(`{"status":{}}`); err != nil {
		t.Fatalf("the nudge was refused: %v", err)
	}
	ours := `{"metadata":{"annotations":{"overcommit.dev/raw-allocatable":"cpu=4","overcommit.dev/applied":"policy=p;ratios=cpu=2"}},"status":{"allocatable":{"cpu":"5"}}}`
	if err := statusPatch(ours); err != nil {
		t.Fatalf("allocatable and the two annotations were refused: %v", err)
	}
	got := get()
	if q := got.Status.Allocatable[corev1.ResourceCPU]; q.String() != "5" || got.Annotations["overcommit.dev/applied"] != "policy=p;ratios=cpu=2" {
		t.Errorf("the accepted write was not stored: cpu %s, annotations %v", q.String(), got.Annotations)
	}
	if err := statusPatch(`{"metadata":{"annotations":{"overcommit.dev/raw-allocatable":null,"overcommit.dev/applied":null}}}`); err != nil {
		t.Errorf("removing the two annotations was refused: %v", err)
	}
	// The pressure taint (src/leader/pressure.rs): added, changed and removed by the
	// ServiceAccount, beside an admin's taint that stays as it was.
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"spec":{"taints":[{"key":"admin","effect":"NoSchedule"}]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("the admin's taint: %v", err)
	}
	admin := `{"key":"admin","effect":"NoSchedule"}`
	for _, body := range []string{
		`{}`,
		`{"spec":{"taints":[` + admin + `,{"key":"overcommit.dev/pressure","value":"cpu","effect":"NoSchedule"}]}}`,
		`{"spec":{"taints":[` + admin + `,{"key":"overcommit.dev/pressure","value":"cpu-memory","effect":"NoSchedule"}]}}`,
		`{"spec":{"taints":[` + admin + `]}}`,
	} {
		if err := mergePatch(body); err != nil {
			t.Errorf("the ServiceAccount's write %s was refused: %v", body, err)
		}
	}
	if err := mergePatch(`{"spec":{"taints":[]}}`); !byGuard(err) {
		t.Errorf("removing the admin's taint: want refused by kube-overcommit-node-guard, got %v", err)
	}
	if taints := get().Spec.Taints; len(taints) != 1 || taints[0].Key != "admin" {
		t.Errorf("taints after the ServiceAccount's writes: %v, want the admin's alone", taints)
	}
	// Another user (the admin) is not bound by the guard.
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"guard":"admin"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the admin's label write: %v", err)
	}
}

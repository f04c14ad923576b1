package deploytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	admissionregistrationv1client "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
)

// TestClusterInProcessBindingBounds: what keeps in-process mode from being a way into the whole
// cluster. No admission policy or webhook can guard MutatingAdmissionPolicies (the API server
// exempts admission configuration from them), and the ServiceAccount may create and update one,
// so its matchConstraints and mutation are whatever a stolen token writes. The bound is the
// binding components/in-process ships, which the ServiceAccount can only read: a policy that
// matches pods and nodes, bound by a binding with the shipped matchResources, mutates a node
// registration and not a pod. Shown on the real API server (dry-run creates, so nothing is left
// behind), with the same binding first without matchResources: then it mutates the pod, so the
// test can fail.
func TestClusterInProcessBindingBounds(t *testing.T) {
	cfg := clusterConfig(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(cfg)
	ar := client.AdmissionregistrationV1()

	b, err := Kustomize(root, "tests/deploy/testdata/components")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	shippedObj := Find(objs, "MutatingAdmissionPolicyBinding", "kube-overcommit")
	if shippedObj == nil {
		t.Fatal("components/in-process ships no MutatingAdmissionPolicyBinding kube-overcommit")
	}
	shipped := convert[admissionregistrationv1.MutatingAdmissionPolicyBinding](t, shippedObj)
	if shipped.Spec.MatchResources == nil {
		t.Fatal("the shipped binding has no matchResources")
	}

	// A forged policy: every pod and node write gets a label.
	const name = "deploy-test-binding-bounds"
	const label = "deploy-test-forged"
	rule := func(resource string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.OperationAll},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}},
		}}
	}
	forged := &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{rule("pods"), rule("nodes")}},
			Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeJSONPatch, JSONPatch: &admissionregistrationv1.JSONPatch{
				Expression: `[JSONPatch{op: "add", path: "/metadata/labels", value: {"` + label + `": "yes"}}]`}}},
			FailurePolicy:      ptr(admissionregistrationv1.Ignore),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name},
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = ar.MutatingAdmissionPolicyBindings().Delete(bg, name, metav1.DeleteOptions{})
		_ = ar.MutatingAdmissionPolicies().Delete(bg, name, metav1.DeleteOptions{})
	})
	if _, err := ar.MutatingAdmissionPolicies().Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ar.MutatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	labelled := func(ctx context.Context) (pod, node bool, err error) {
		p, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}, dry)
		if err != nil {
			return false, false, fmt.Errorf("pod: %w", err)
		}
		n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": name}}}, dry)
		if err != nil {
			return false, false, fmt.Errorf("node: %w", err)
		}
		return p.Labels[label] == "yes", n.Labels[label] == "yes", nil
	}
	waitFor := func(what string, wantPod, wantNode bool) {
		t.Helper()
		var last string
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			pod, node, err := labelled(ctx)
			if err != nil {
				last = err.Error()
				return false, nil
			}
			last = fmt.Sprintf("pod mutated %v, node mutated %v", pod, node)
			return pod == wantPod && node == wantNode, nil
		})
		if err != nil {
			t.Fatalf("%s: want pod mutated %v, node mutated %v; last: %s", what, wantPod, wantNode, last)
		}
	}
	// Unbounded binding: the forged policy reaches pods (what the bound must stop).
	waitFor("binding without matchResources", true, true)

	// The shipped binding's bound: nodes only.
	live, err := ar.MutatingAdmissionPolicyBindings().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Spec.MatchResources = shipped.Spec.MatchResources.DeepCopy()
	if _, err := ar.MutatingAdmissionPolicyBindings().Update(ctx, live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("binding with the shipped matchResources", false, true)
}

// TestClusterInProcessRBAC: what the ServiceAccount can write of the compiled
// MutatingAdmissionPolicy and its binding, tried on the real API server as the ServiceAccount
// (impersonated; dry-run writes, so that nothing changes), for every rendering of in-process
// mode. Kept by the leader (components/in-process, Helm inProcess.enabled): it may update the
// policy kube-overcommit, and nothing else: no create (of any name), no update of another
// policy, no patch, no delete, no write at all on the binding. Kept by the operator
// (components/in-process-operator, inProcess.policy=operator): no write at all. The shipped
// objects are applied as rendered, so the API server accepts the placeholder policy as well.
func TestClusterInProcessRBAC(t *testing.T) {
	cfg := clusterConfig(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ap, err := NewApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(cfg).AdmissionregistrationV1()
	sa := kubernetes.NewForConfigOrDie(asServiceAccount(cfg, "kube-overcommit")).AdmissionregistrationV1()

	// Someone else's policy, for the ServiceAccount to try to update.
	const other = "deploy-test-someone-else"
	otherPolicy := &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: other},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes/status"}},
				}}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}},
			Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{Expression: `[JSONPatch{op: "test", path: "/kind", value: "Node"}]`}}},
			FailurePolicy:      ptr(admissionregistrationv1.Ignore),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
	if _, err := admin.MutatingAdmissionPolicies().Create(ctx, otherPolicy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.MutatingAdmissionPolicies().Delete(context.Background(), other, metav1.DeleteOptions{})
	})

	// The shipped objects, for the operator renderings (which ship none) as an operator would
	// apply them.
	component, err := Kustomize(root, "tests/deploy/testdata/components")
	if err != nil {
		t.Fatal(err)
	}
	componentObjs, err := Parse(component)
	if err != nil {
		t.Fatal(err)
	}
	shipped := []*unstructured.Unstructured{
		mustFind(t, componentObjs, "MutatingAdmissionPolicy", "kube-overcommit"),
		mustFind(t, componentObjs, "MutatingAdmissionPolicyBinding", "kube-overcommit"),
	}

	type rendering struct {
		name   string
		leader bool
		render func() ([]byte, error)
	}
	renderings := []rendering{
		{"kustomize components/in-process", true, func() ([]byte, error) { return component, nil }},
		{"helm inProcess.enabled", true, func() ([]byte, error) {
			return HelmTemplate(root, helm, "kube-overcommit", "--set", "inProcess.enabled=true")
		}},
		{"kustomize components/in-process-operator", false, func() ([]byte, error) {
			return Kustomize(root, "tests/deploy/testdata/operator")
		}},
		{"helm inProcess.policy=operator", false, func() ([]byte, error) {
			return HelmTemplate(root, helm, "kube-overcommit", "--set", "inProcess.enabled=true", "--set", "inProcess.policy=operator")
		}},
	}
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			b, err := r.render()
			if err != nil {
				t.Fatal(err)
			}
			all, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			// The cluster-scoped grants and the compiled objects: the ServiceAccount is
			// impersonated, so its namespace and Deployment are not needed.
			var objs []*unstructured.Unstructured
			for _, o := range all {
				switch o.GetKind() {
				case "ClusterRole", "ClusterRoleBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding":
					objs = append(objs, o)
				}
			}
			if r.leader != (Find(objs, "MutatingAdmissionPolicy", "kube-overcommit") != nil) {
				t.Fatalf("rendering ships the policy: %v, want %v", !r.leader, r.leader)
			}
			if !r.leader {
				objs = append(objs, shipped...)
			}
			t.Cleanup(func() {
				dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer dcancel()
				if err := ap.Delete(dctx, objs); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			})
			if err := ap.Apply(ctx, objs); err != nil {
				t.Fatal(err)
			}
			checkInProcessWrites(t, ctx, sa, r.leader, other)
		})
	}
}

// checkInProcessWrites tries every write on the compiled objects as the ServiceAccount (dry
// run): with leader, only the update of the policy kube-overcommit is allowed. RBAC is cached
// by the authorizer for a moment after an apply: the allowed update is waited for first.
func checkInProcessWrites(t *testing.T, ctx context.Context, sa admissionregistrationv1client.AdmissionregistrationV1Interface, leader bool, other string) {
	t.Helper()
	policies, bindings := sa.MutatingAdmissionPolicies(), sa.MutatingAdmissionPolicyBindings()
	dryUpdate := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	dryCreate := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	dryPatch := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	// Reading both is allowed in every rendering (every replica watches them).
	var live *admissionregistrationv1.MutatingAdmissionPolicy
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if _, err := bindings.Get(ctx, "kube-overcommit", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		live = p
		return true, nil
	})
	if err != nil {
		t.Fatalf("the ServiceAccount cannot read the compiled policy and binding: %v", err)
	}
	// What a stolen token would write into the policy: fail closed, match everything.
	forged := live.DeepCopy()
	forged.Spec.FailurePolicy = ptr(admissionregistrationv1.Fail)
	forged.Spec.MatchConditions = nil
	var updateErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, updateErr = policies.Update(ctx, forged, dryUpdate)
		return (updateErr == nil) == leader, nil
	})
	if err != nil {
		t.Errorf("update of the policy kube-overcommit: %v, want allowed %v", updateErr, leader)
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want forbidden", what, err)
		}
	}
	if !leader {
		refused("update of the policy kube-overcommit (kept by the operator)", updateErr)
	}
	renamed := live.DeepCopy()
	renamed.ObjectMeta = metav1.ObjectMeta{Name: "deploy-test-new-policy"}
	_, err = policies.Create(ctx, renamed, dryCreate)
	refused("create of a MutatingAdmissionPolicy of another name", err)
	again := live.DeepCopy()
	again.ResourceVersion = ""
	_, err = policies.Create(ctx, again, dryCreate)
	refused("create of the MutatingAdmissionPolicy kube-overcommit", err)
	theirs, err := policies.Get(ctx, other, metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("get of someone else's policy: %v, want forbidden", err)
	}
	if theirs == nil || theirs.Name == "" {
		theirs = live.DeepCopy()
		theirs.Name = other
		theirs.ResourceVersion = ""
	}
	_, err = policies.Update(ctx, theirs, dryUpdate)
	refused("update of someone else's policy", err)
	_, err = policies.Patch(ctx, "kube-overcommit", types.MergePatchType, []byte(`{"spec":{"failurePolicy":"Fail"}}`), dryPatch)
	refused("patch of the policy kube-overcommit", err)
	refused("delete of the policy kube-overcommit", policies.Delete(ctx, "kube-overcommit", dryDelete))
	refused("delete of someone else's policy", policies.Delete(ctx, other, dryDelete))
	binding, err := bindings.Get(ctx, "kube-overcommit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	binding.Spec.MatchResources = nil
	_, err = bindings.Update(ctx, binding, dryUpdate)
	refused("update of the binding (widened)", err)
	_, err = bindings.Patch(ctx, "kube-overcommit", types.MergePatchType, []byte(`{"spec":{"policyName":"x"}}`), dryPatch)
	refused("patch of the binding", err)
	refused("delete of the binding", bindings.Delete(ctx, "kube-overcommit", dryDelete))
	newBinding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deploy-test-new-binding"},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: "kube-overcommit"},
	}
	_, err = bindings.Create(ctx, newBinding, dryCreate)
	refused("create of a binding", err)
}

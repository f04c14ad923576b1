package deploytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
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

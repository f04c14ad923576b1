package deploytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// The cluster tests run against the local control plane of tests/cluster, whose kubeconfig
// `make test-deploy` passes in KUBECONFIG. They are not skipped without it: they fail and say so.
func clusterConfig(t *testing.T) *rest.Config {
	t.Helper()
	path := os.Getenv("KUBECONFIG")
	if path == "" {
		t.Fatal("KUBECONFIG is not set: run `make test-deploy`, which starts the local control plane (tests/cluster) and points KUBECONFIG at it")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", path, err)
	}
	for _, h := range []string{cfg.Host} {
		if !strings.Contains(h, "127.0.0.1") && !strings.Contains(h, "localhost") {
			t.Fatalf("KUBECONFIG points at %s: these tests only run against the local control plane on 127.0.0.1", h)
		}
	}
	cfg.QPS, cfg.Burst = 100, 200
	return cfg
}

// TestClusterKustomize: deploy/overlays/production (deploy/ plus the monitoring and
// network-policy components) and deploy/examples applied server-side, with the Prometheus
// Operator's CRDs for the monitoring objects, then the install checks. (deploy/ alone is the
// same minus those components; TestStaticInstallContainsEverything checks its contents.)
func TestClusterKustomize(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := MonitoringCRDs(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"deploy/overlays/production", "deploy/examples"} {
		b, err := Kustomize(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		o, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	checkInstall(t, objs, "kube-overcommit", false)
}

// TestClusterHelm: `helm template --include-crds` with every optional object (default policy,
// monitoring, NetworkPolicy), applied server-side into
// a namespace created first (as `helm install --create-namespace` does), then the install checks.
func TestClusterHelm(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := HelmBinary(root)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--include-crds",
		"--set", "policy.podDefaults.requests.cpu=50m", "--set", "policy.podDefaults.requestToLimitPercent.cpu=25",
		"--set", "policy.nodeSelector.matchLabels.pool=batch"}, helmAllArgs...)
	b, err := HelmTemplate(root, helm, "kube-overcommit", args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := MonitoringCRDs(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, chart...)
	nsObj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "kube-overcommit", "labels": map[string]any{
			"pod-security.kubernetes.io/enforce": "restricted",
		}},
	}}
	checkInstall(t, append([]*unstructured.Unstructured{nsObj}, objs...), "kube-overcommit", true)
}

// checkInstall applies objs and checks scheduling, the PodDisruptionBudget under drains, RBAC on
// the real authorizer and the webhook-guard admission policy; then removes everything.
func checkInstall(t *testing.T, objs []*unstructured.Unstructured, ns string, helm bool) {
	cfg := clusterConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(cfg)
	ap, err := NewApplier(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Pods are marked Running/Ready by the fake nodes of tests/cluster (kcp fake-nodes
	// --run-pods, on by default), which also finish deletions, as a kubelet does.
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := ap.Delete(dctx, objs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	start := time.Now()
	if err := ap.Apply(ctx, objs); err != nil {
		t.Fatal(err)
	}
	t.Logf("server-side apply of %d objects: %v", len(objs), time.Since(start).Round(time.Millisecond))
	// Applying the same manifests again changes nothing and conflicts with nothing.
	if err := ap.Apply(ctx, objs); err != nil {
		t.Fatalf("second apply: %v", err)
	}

	nodes := schedulableNodes(t, ctx, client)
	if len(nodes) < 4 {
		t.Fatalf("%d schedulable nodes (%v): the drain test needs at least 4 (3 replicas, one per node, and a spare)", len(nodes), nodes)
	}

	watcher := watchReplicas(t, ctx, client, ns)
	pods := waitReplicas(t, ctx, client, ns, 3)
	t.Logf("scheduled and ready after %v: %v", time.Since(start).Round(time.Millisecond), podNodes(pods))
	waitPDB(t, ctx, client, ns, 1)

	t.Run("rbac", func(t *testing.T) { checkRBAC(t, ctx, client, ns) })
	t.Run("webhook-guard", func(t *testing.T) { checkWebhookGuard(t, ctx, cfg, ns) })
	t.Run("drain", func(t *testing.T) { checkDrain(t, ctx, client, ns, pods, watcher) })
	if helm {
		pol := Find(objs, "OvercommitPolicy", "default")
		if pol == nil {
			t.Error("helm rendering has no default OvercommitPolicy")
		}
	}
}

func schedulableNodes(t *testing.T, ctx context.Context, c kubernetes.Interface) []string {
	t.Helper()
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range list.Items {
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if ready && !n.Spec.Unschedulable {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

func replicaSelector() string {
	return "app.kubernetes.io/name=kube-overcommit,app.kubernetes.io/component=webhook"
}

// waitReplicas waits until want pods are Ready on distinct nodes, and returns them.
func waitReplicas(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: replicaSelector()})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		nodes := map[string]bool{}
		var states []string
		for _, p := range list.Items {
			states = append(states, fmt.Sprintf("%s@%s ready=%v", p.Name, p.Spec.NodeName, isReady(&p)))
			if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && isReady(&p) {
				pods = append(pods, p)
				nodes[p.Spec.NodeName] = true
			}
		}
		last = strings.Join(states, ", ")
		return len(pods) == want && len(nodes) == want, nil
	})
	if err != nil {
		d, _ := c.AppsV1().Deployments(ns).Get(ctx, "kube-overcommit", metav1.GetOptions{})
		ev, _ := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		var msgs []string
		if ev != nil {
			for _, e := range ev.Items {
				msgs = append(msgs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
			}
		}
		t.Fatalf("%d ready replicas on distinct nodes not reached: pods [%s]; deployment status %+v; events %v", want, last, d.Status, msgs)
	}
	return slices.Clone(pods)
}

func podNodes(pods []corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		out[p.Name] = p.Spec.NodeName
	}
	return out
}

func waitPDB(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, allowed int32) {
	t.Helper()
	var last policyv1.PodDisruptionBudgetStatus
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = pdb.Status
		return pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.DisruptionsAllowed == allowed && pdb.Status.ExpectedPods == 3, nil
	})
	if err != nil {
		t.Fatalf("PDB never allowed %d disruption(s): status %+v", allowed, last)
	}
}

// replicaWatcher records the fewest Ready, not-terminating replicas seen at any moment.
type replicaWatcher struct {
	mu       sync.Mutex
	minReady int
	history  []string
}

func watchReplicas(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string) *replicaWatcher {
	w := &replicaWatcher{minReady: -1}
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = replicaSelector() }))
	inf := f.Core().V1().Pods().Informer()
	count := func() {
		ready := 0
		for _, obj := range inf.GetStore().List() {
			p := obj.(*corev1.Pod)
			if p.DeletionTimestamp == nil && isReady(p) {
				ready++
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.minReady == -1 {
			if ready < 3 {
				return // still starting up
			}
			w.minReady = ready
		}
		if ready < w.minReady {
			w.minReady = ready
		}
		w.history = append(w.history, fmt.Sprintf("%s ready=%d", time.Now().Format("15:04:05.000"), ready))
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { count() },
		UpdateFunc: func(any, any) { count() },
		DeleteFunc: func(any) { count() },
	})
	wctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	f.Start(wctx.Done())
	f.WaitForCacheSync(wctx.Done())
	return w
}

func (w *replicaWatcher) min() (int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.minReady, slices.Clone(w.history)
}

func evict(ctx context.Context, c kubernetes.Interface, p corev1.Pod) error {
	return c.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
	})
}

func cordon(t *testing.T, ctx context.Context, c kubernetes.Interface, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("cordon %s=%v: %v", node, on, err)
	}
}

// checkDrain drains two replica nodes at once, the way `kubectl drain` does (cordon, then the
// eviction API, retrying on 429), while the spare nodes are held back (cordoned) so that the
// first replacement stays Pending for as long as the test looks: the PDB must refuse the second
// eviction the whole time, and allow it once the replacement is Ready.
func checkDrain(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, pods []corev1.Pod, w *replicaWatcher) {
	pods = slices.Clone(pods)
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	a, b := pods[0], pods[1]
	replicaNodes := map[string]bool{}
	for _, p := range pods {
		replicaNodes[p.Spec.NodeName] = true
	}
	var spares []string
	for _, n := range schedulableNodes(t, ctx, c) {
		if !replicaNodes[n] {
			spares = append(spares, n)
		}
	}
	for _, n := range append([]string{a.Spec.NodeName, b.Spec.NodeName}, spares...) {
		cordon(t, ctx, c, n, true)
		defer cordon(t, context.Background(), c, n, false)
	}

	if err := evict(ctx, c, a); err != nil {
		t.Fatalf("first eviction (%s on %s): %v", a.Name, a.Spec.NodeName, err)
	}
	// Refused at once: the eviction API counts the first disruption before any controller runs.
	if err := evict(ctx, c, b); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction right after the first: got %v, want 429 TooManyRequests (PDB maxUnavailable 1)", err)
	}
	// Refused still once the disruption controller has seen the Pending replacement.
	var last policyv1.PodDisruptionBudgetStatus
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pdb, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "kube-overcommit", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = pdb.Status
		return pdb.Status.ObservedGeneration == pdb.Generation && len(pdb.Status.DisruptedPods) == 0 &&
			pdb.Status.CurrentHealthy == 2 && pdb.Status.DisruptionsAllowed == 0 &&
			len(replacementPods(t, ctx, c, ns, pods)) > 0, nil
	})
	if err != nil {
		t.Fatalf("PDB status never settled at 2 healthy, 0 allowed, with a replacement created: %+v", last)
	}
	pending := replacementPods(t, ctx, c, ns, pods)
	if len(pending) != 1 || pending[0].Spec.NodeName != "" {
		t.Fatalf("want one unscheduled replacement while the spares are cordoned, got %v", podNodes(pending))
	}
	if err := evict(ctx, c, b); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction while the replacement is Pending: got %v, want 429", err)
	}
	refused := 2

	// Capacity comes back: the replacement is scheduled onto a spare, becomes Ready, and only
	// then does the eviction go through.
	for _, n := range spares {
		cordon(t, ctx, c, n, false)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := evict(ctx, c, b)
		switch {
		case err == nil:
			// Whether it was Ready before the eviction is the watcher's check below (in
			// resourceVersion order, a replica count of 1 would have been seen).
			ready := false
			for _, p := range replacementPods(t, ctx, c, ns, pods) {
				ready = ready || isReady(&p)
			}
			if !ready {
				return false, fmt.Errorf("second eviction allowed with no Ready replacement")
			}
			return true, nil
		case apierrors.IsTooManyRequests(err):
			refused++
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		t.Fatalf("second eviction: %v", err)
	}
	for _, p := range replacementPods(t, ctx, c, ns, pods) {
		if replicaNodes[p.Spec.NodeName] && (p.Spec.NodeName == a.Spec.NodeName || p.Spec.NodeName == b.Spec.NodeName) {
			t.Errorf("replacement %s scheduled on drained node %s", p.Name, p.Spec.NodeName)
		}
	}
	t.Logf("second eviction refused %d times (twice while the replacement was Pending), allowed once it was Ready", refused)

	// Both drained replicas come back on the spares (one per node).
	waitReplicasAtLeast(t, ctx, c, ns, min(3, len(spares)+1))
	minReady, history := w.min()
	if minReady < 2 {
		t.Errorf("at some moment only %d replicas were Ready (want >= 2); history: %v", minReady, history)
	}
	t.Logf("fewest Ready replicas at any moment during the drain: %d (%d observations)", minReady, len(history))
}

// replacementPods are the replica pods created after the drain began (not among the original
// ones) and not terminating.
func replacementPods(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, originals []corev1.Pod) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: replicaSelector()})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		original := slices.ContainsFunc(originals, func(o corev1.Pod) bool { return o.UID == p.UID })
		if !original && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

func waitReplicasAtLeast(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, want int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: replicaSelector()})
		if err != nil {
			return false, nil
		}
		n := 0
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && isReady(&p) {
				n++
			}
		}
		return n >= want, nil
	})
	if err != nil {
		t.Fatalf("fewer than %d Ready replicas after the drain", want)
	}
}

// checkRBAC asks the real authorizer what the ServiceAccount may do.
func checkRBAC(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string) {
	user := "system:serviceaccount:" + ns + ":kube-overcommit"
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	cases := []struct {
		allowed                     bool
		verb, group, resource, name string
		namespace                   string
	}{
		{true, "get", "", "secrets", "kube-overcommit-ca", ns},
		{true, "update", "", "secrets", "kube-overcommit-tls", ns},
		{true, "watch", "", "secrets", "kube-overcommit-tls", ns},
		{true, "create", "", "secrets", "", ns},
		{true, "patch", "", "secrets", "kube-overcommit-tls", ns},
		{false, "patch", "", "secrets", "some-other-secret", ns},
		{false, "get", "", "secrets", "some-other-secret", ns},
		{false, "list", "", "secrets", "", ns},
		{false, "delete", "", "secrets", "kube-overcommit-ca", ns},
		{false, "get", "", "secrets", "kube-overcommit-ca", "default"},
		{true, "update", "coordination.k8s.io", "leases", "kube-overcommit-leader", ns},
		{true, "create", "coordination.k8s.io", "leases", "", ns},
		{true, "delete", "coordination.k8s.io", "leases", "kube-overcommit-leader-replica-x", ns},
		{false, "update", "coordination.k8s.io", "leases", "kube-controller-manager", "kube-system"},
		{true, "get", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""},
		{false, "update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "someone-else", ""},
		{false, "delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "get", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "kube-overcommit", ""},
		{true, "create", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", ""},
		{false, "update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "someone-else", ""},
		{false, "delete", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "someone-else", ""},
		{false, "update", "admissionregistration.k8s.io", "validatingadmissionpolicies", "kube-overcommit-webhook-guard", ""},
		// In-process mode without components/in-process: the compiled policy and its binding
		// read, nothing written.
		{true, "get", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", ""},
		{true, "watch", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "kube-overcommit", ""},
		{false, "delete", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", ""},
		{false, "create", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "", ""},
		{false, "update", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", ""},
		{false, "patch", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "kube-overcommit", ""},
		{false, "create", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "", ""},
		{false, "update", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "kube-overcommit", ""},
		{false, "delete", "admissionregistration.k8s.io", "mutatingadmissionpolicybindings", "kube-overcommit", ""},
		{false, "delete", "admissionregistration.k8s.io", "mutatingadmissionpolicies", "someone-else", ""},
		{true, "watch", "overcommit.dev", "overcommitpolicies", "", ""},
		{false, "update", "overcommit.dev", "overcommitpolicies", "default", ""},
		{true, "list", "", "nodes", "", ""},
		{true, "watch", "", "nodes", "", ""},
		{false, "get", "", "nodes", "some-node", ""},
		{false, "update", "", "nodes", "some-node", ""},
		// The leader's pressure taint (the node guard bounds it to its own taint key).
		{true, "patch", "", "nodes", "some-node", ""},
		// The leader's nudges (an empty status patch; the node guard bounds what it may change).
		{true, "patch", "", "nodes/status", "some-node", ""},
		{false, "update", "", "nodes/status", "some-node", ""},
		{false, "get", "", "nodes/status", "some-node", ""},
		{false, "delete", "", "nodes", "some-node", ""},
		// Usage policies and the placement cap: every replica lists, watches and gets pods (the
		// cap reads a pod its watch has not shown yet), and that is all it may do with them.
		{true, "list", "", "pods", "", ""},
		{true, "watch", "", "pods", "", ""},
		{true, "get", "", "pods", "some-pod", ns},
		{false, "update", "", "pods", "some-pod", ns},
		{false, "create", "", "pods/binding", "", "default"},
		{false, "create", "", "pods", "", ns},
		{false, "delete", "", "pods", "some-pod", ns},
		{true, "list", "metrics.k8s.io", "nodes", "", ""},
		{false, "get", "metrics.k8s.io", "nodes", "some-node", ""},
		// Memory relief: PodMetrics listed, pods evicted through the Eviction API (PDBs hold),
		// never deleted or patched.
		{true, "list", "metrics.k8s.io", "pods", "", ""},
		{false, "get", "metrics.k8s.io", "pods", "some-pod", ns},
		{true, "create", "", "pods/eviction", "some-pod", "default"},
		{false, "delete", "", "pods", "some-pod", "default"},
		{false, "patch", "", "pods", "some-pod", "default"},
		{false, "get", "", "configmaps", "", ns},
	}
	for _, tc := range cases {
		attrs := authorizationv1.ResourceAttributes{
			Namespace: tc.namespace, Verb: tc.verb, Group: tc.group, Resource: tc.resource, Name: tc.name,
		}
		if allowed, reason := accessAllowed(t, ctx, c, user, groups, attrs); allowed != tc.allowed {
			t.Errorf("%s %s/%s %q in %q: allowed=%v, want %v (%s)", tc.verb, tc.group, tc.resource, tc.name, tc.namespace, allowed, tc.allowed, reason)
		}
	}
	// No way into a process (SECURITY.md: "It cannot ... exec into anything"): exec, attach and
	// port-forward on pods (create, and get, which websocket clients used to be authorized
	// with), in its own namespace, kube-system and another, and the kubelet API through
	// nodes/proxy. Every one refused by the real authorizer.
	for _, namespace := range []string{ns, "kube-system", "default"} {
		for _, sub := range []string{"exec", "attach", "portforward"} {
			for _, verb := range []string{"create", "get"} {
				attrs := authorizationv1.ResourceAttributes{Namespace: namespace, Verb: verb, Resource: "pods", Subresource: sub}
				if allowed, reason := accessAllowed(t, ctx, c, user, groups, attrs); allowed {
					t.Errorf("%s pods/%s in %q: allowed (%s), want refused", verb, sub, namespace, reason)
				}
			}
		}
	}
	for _, verb := range []string{"create", "get"} {
		attrs := authorizationv1.ResourceAttributes{Verb: verb, Resource: "nodes", Subresource: "proxy", Name: "some-node"}
		if allowed, reason := accessAllowed(t, ctx, c, user, groups, attrs); allowed {
			t.Errorf("%s nodes/proxy: allowed (%s), want refused", verb, reason)
		}
	}
}

// accessAllowed asks the API server's authorizer (SubjectAccessReview) whether user may do attrs.
func accessAllowed(t *testing.T, ctx context.Context, c kubernetes.Interface, user string, groups []string, attrs authorizationv1.ResourceAttributes) (bool, string) {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups, ResourceAttributes: &attrs,
	}}
	got, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed, got.Status.Reason
}

// checkWebhookGuard writes webhook configurations as the ServiceAccount (impersonated, dry run:
// authorization and admission run, nothing is stored): the configuration kube-overcommit needs
// is allowed, anything that would point the API server elsewhere is refused.
func checkWebhookGuard(t *testing.T, ctx context.Context, cfg *rest.Config, ns string) {
	sa := asServiceAccount(cfg, ns)
	asSA := kubernetes.NewForConfigOrDie(sa)
	admin := kubernetes.NewForConfigOrDie(cfg)

	good := func() *admissionregistrationv1.MutatingWebhookConfiguration { return leaderConfig(ns) }
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	bad := guardWidenings(ns)
	// The policy takes effect once the API server has loaded it: wait for the first refusal.
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		m := good()
		bad["url instead of Service"](m)
		_, lastErr = asSA.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, dry)
		return apierrors.IsInvalid(lastErr) || apierrors.IsForbidden(lastErr), nil
	})
	if err != nil {
		t.Fatalf("the webhook-guard policy never refused a url clientConfig: last answer %v", lastErr)
	}
	if _, err := asSA.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, good(), dry); err != nil {
		t.Errorf("the configuration kube-overcommit needs is refused: %v", err)
	}
	for name, mutate := range bad {
		m := good()
		mutate(m)
		_, err := asSA.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, dry)
		if err == nil {
			t.Errorf("%s: allowed for the ServiceAccount", name)
			continue
		}
		if !strings.Contains(err.Error(), "kube-overcommit-webhook-guard") && !apierrors.IsForbidden(err) {
			t.Errorf("%s: refused, but not by the guard or RBAC: %v", name, err)
		}
		// Cluster admins are not limited by it.
		if _, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, m, dry); err != nil {
			t.Errorf("%s: refused for a cluster admin too: %v", name, err)
		}
	}
	// The placement cap's ValidatingWebhookConfiguration (--request-cap), the same way.
	vwcs := asSA.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := vwcs.Create(ctx, leaderValidatingConfig(ns), dry); err != nil {
		t.Errorf("the validating configuration kube-overcommit needs is refused: %v", err)
	}
	for name, widen := range validatingWidenings(ns) {
		v := leaderValidatingConfig(ns)
		widen(v)
		if _, err := vwcs.Create(ctx, v, dry); refusedByGuard(err) != nil {
			t.Errorf("validating, %s: %v", name, refusedByGuard(err))
		}
	}
	renamed := leaderValidatingConfig(ns)
	renamed.Name = "someone-else"
	if _, err := vwcs.Create(ctx, renamed, dry); err == nil {
		t.Error("a ValidatingWebhookConfiguration of another name: allowed for the ServiceAccount")
	}
}

func ptr[T any](v T) *T { return &v }

// asServiceAccount: cfg impersonating kube-overcommit's ServiceAccount in ns (its groups too).
func asServiceAccount(cfg *rest.Config, ns string) *rest.Config {
	sa := rest.CopyConfig(cfg)
	sa.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":kube-overcommit",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	return sa
}

// refusedByGuard: err is a refusal by the webhook guard or RBAC (nil: allowed).
func refusedByGuard(err error) error {
	if err == nil {
		return fmt.Errorf("allowed for the ServiceAccount")
	}
	if !strings.Contains(err.Error(), "kube-overcommit-webhook-guard") && !apierrors.IsForbidden(err) {
		return fmt.Errorf("refused, but not by the guard or RBAC: %v", err)
	}
	return nil
}

// leaderConfig is the MutatingWebhookConfiguration the leader writes for namespace ns
// (src/leader/webhook_config.rs `desired`), with a caBundle that trusts nothing.
func leaderConfig(ns string) *admissionregistrationv1.MutatingWebhookConfiguration {
	hook := func(name string, cond admissionregistrationv1.MatchCondition, rules ...admissionregistrationv1.RuleWithOperations) admissionregistrationv1.MutatingWebhook {
		return admissionregistrationv1.MutatingWebhook{
			Name: name,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "kube-overcommit", Port: ptr(int32(443)), Path: ptr("/mutate")},
			},
			Rules:                   rules,
			FailurePolicy:           ptr(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr(admissionregistrationv1.Equivalent),
			ReinvocationPolicy:      ptr(admissionregistrationv1.NeverReinvocationPolicy),
			SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr(int32(2)),
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions:         []admissionregistrationv1.MatchCondition{cond},
		}
	}
	rule := func(op admissionregistrationv1.OperationType, resource string, scope admissionregistrationv1.ScopeType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{op},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}, Scope: &scope}}
	}
	nodes := hook("nodes.overcommit.dev", admissionregistrationv1.MatchCondition{Name: "node-registration-kubelet-or-nudge",
		Expression: "request.operation == 'CREATE' || (has(request.userInfo.groups) && 'system:nodes' in request.userInfo.groups) || " +
			"request.userInfo.username == 'system:serviceaccount:" + ns + ":kube-overcommit'"},
		rule(admissionregistrationv1.Update, "nodes/status", admissionregistrationv1.ClusterScope),
		rule(admissionregistrationv1.Create, "nodes", admissionregistrationv1.ClusterScope))
	pods := hook("pods.overcommit.dev", admissionregistrationv1.MatchCondition{Name: "not-a-mirror-pod",
		Expression: "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)"},
		rule(admissionregistrationv1.Create, "pods", admissionregistrationv1.NamespacedScope))
	pods.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", ns}},
		{Key: "overcommit.dev/pod-defaults", Operator: metav1.LabelSelectorOpIn, Values: []string{"enabled"}},
	}}
	pods.ObjectSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "overcommit.dev/disabled", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"true"}},
	}}
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-overcommit"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{nodes, pods},
	}
}

// leaderValidatingConfig is the ValidatingWebhookConfiguration the leader writes with
// --request-cap (src/leader/webhook_config.rs desired_validating), without its caBundle.
func leaderValidatingConfig(ns string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	rule := func(resource string) admissionregistrationv1.RuleWithOperations {
		scope := admissionregistrationv1.NamespacedScope
		return admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{resource}, Scope: &scope}}
	}
	hook := func(name string, conditions []admissionregistrationv1.MatchCondition, rules ...admissionregistrationv1.RuleWithOperations) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name: name,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: ns, Name: "kube-overcommit", Port: ptr(int32(443)), Path: ptr("/validate")},
			},
			Rules:                   rules,
			FailurePolicy:           ptr(admissionregistrationv1.Ignore),
			MatchPolicy:             ptr(admissionregistrationv1.Equivalent),
			SideEffects:             ptr(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr(int32(2)),
			AdmissionReviewVersions: []string{"v1"},
			MatchConditions:         conditions,
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", ns}},
			}},
		}
	}
	bindings := hook("bindings.cap.overcommit.dev", nil, rule("pods/binding"), rule("bindings"))
	placed := hook("placed-pods.cap.overcommit.dev", []admissionregistrationv1.MatchCondition{
		{Name: "node-name-set", Expression: "has(object.spec.nodeName) && object.spec.nodeName != ''"},
		{Name: "not-a-mirror-pod", Expression: "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)"},
	}, rule("pods"))
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-overcommit"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{bindings, placed},
	}
}

// validatingWidenings: changes to the leader's validating configuration (webhook 0: bindings,
// 1: placed pods) that the guard refuses for the ServiceAccount.
func validatingWidenings(ns string) map[string]func(*admissionregistrationv1.ValidatingWebhookConfiguration) {
	type v = admissionregistrationv1.ValidatingWebhookConfiguration
	return map[string]func(*v){
		"failurePolicy Fail": func(c *v) { c.Webhooks[0].FailurePolicy = ptr(admissionregistrationv1.Fail) },
		"url instead of Service": func(c *v) {
			c.Webhooks[1].ClientConfig.Service = nil
			c.Webhooks[1].ClientConfig.URL = ptr("https://attacker.example/validate")
		},
		"path /mutate":         func(c *v) { c.Webhooks[0].ClientConfig.Service.Path = ptr("/mutate") },
		"timeout 10":           func(c *v) { c.Webhooks[1].TimeoutSeconds = ptr(int32(10)) },
		"every pod create":     func(c *v) { c.Webhooks[1].MatchConditions = nil },
		"kube-system included": func(c *v) { c.Webhooks[0].NamespaceSelector = nil },
		"rules widened": func(c *v) {
			c.Webhooks[0].Rules[0].Resources = []string{"*"}
		},
		"a mutating webhook's name": func(c *v) { c.Webhooks[0].Name = "nodes.overcommit.dev" },
		"another webhook": func(c *v) {
			extra := c.Webhooks[1].DeepCopy()
			extra.Name = "other.cap.overcommit.dev"
			c.Webhooks = append(c.Webhooks, *extra)
		},
	}
}

type widening = func(*admissionregistrationv1.MutatingWebhookConfiguration)

// guardWidenings are changes to the leader's configuration (webhook 0: nodes, 1: pods) that
// widen what the API server sends, or where: the webhook guard refuses each for the
// ServiceAccount.
func guardWidenings(ns string) map[string]widening {
	hook := func(name string) func(m *admissionregistrationv1.MutatingWebhookConfiguration) *admissionregistrationv1.MutatingWebhook {
		return func(m *admissionregistrationv1.MutatingWebhookConfiguration) *admissionregistrationv1.MutatingWebhook {
			for i := range m.Webhooks {
				if m.Webhooks[i].Name == name {
					return &m.Webhooks[i]
				}
			}
			panic("no webhook " + name) // the test's own fixture, never outside input
		}
	}
	nodes, pods := hook("nodes.overcommit.dev"), hook("pods.overcommit.dev")
	both := func(f func(w *admissionregistrationv1.MutatingWebhook)) widening {
		return func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			for i := range m.Webhooks {
				f(&m.Webhooks[i])
			}
		}
	}
	return map[string]widening{
		"another name": func(m *admissionregistrationv1.MutatingWebhookConfiguration) { m.Name = "not-kube-overcommit" },
		"url instead of Service": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr("https://127.0.0.1:9/mutate")}
		},
		"another Service": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).ClientConfig.Service.Name = "elsewhere"
		},
		"path /other":          both(func(w *admissionregistrationv1.MutatingWebhook) { w.ClientConfig.Service.Path = ptr("/other") }),
		"port 9999":            both(func(w *admissionregistrationv1.MutatingWebhook) { w.ClientConfig.Service.Port = ptr(int32(9999)) }),
		"failurePolicy Fail":   both(func(w *admissionregistrationv1.MutatingWebhook) { w.FailurePolicy = ptr(admissionregistrationv1.Fail) }),
		"timeoutSeconds 10":    both(func(w *admissionregistrationv1.MutatingWebhook) { w.TimeoutSeconds = ptr(int32(10)) }),
		"timeoutSeconds unset": both(func(w *admissionregistrationv1.MutatingWebhook) { w.TimeoutSeconds = nil }),
		"reinvocationPolicy IfNeeded": both(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ReinvocationPolicy = ptr(admissionregistrationv1.IfNeededReinvocationPolicy)
		}),
		// Some and Unknown are refused by the API server's own validation in v1.
		"sideEffects NoneOnDryRun": both(func(w *admissionregistrationv1.MutatingWebhook) {
			w.SideEffects = ptr(admissionregistrationv1.SideEffectClassNoneOnDryRun)
		}),
		"pod namespaceSelector dropped": func(m *admissionregistrationv1.MutatingWebhookConfiguration) { pods(m).NamespaceSelector = nil },
		"pod namespaceSelector lets kube-system in": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).NamespaceSelector.MatchExpressions[0].Values = []string{ns}
		},
		"pod namespaceSelector without the opt-in label": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).NamespaceSelector.MatchExpressions = pods(m).NamespaceSelector.MatchExpressions[:1]
		},
		"node namespaceSelector added": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		},
		"pod objectSelector dropped": func(m *admissionregistrationv1.MutatingWebhookConfiguration) { pods(m).ObjectSelector = nil },
		"pod objectSelector matchLabels added": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).ObjectSelector.MatchLabels = map[string]string{"x": "y"}
		},
		"node matchConditions removed": func(m *admissionregistrationv1.MutatingWebhookConfiguration) { nodes(m).MatchConditions = nil },
		"pod matchConditions removed":  func(m *admissionregistrationv1.MutatingWebhookConfiguration) { pods(m).MatchConditions = nil },
		"node matchConditions changed": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).MatchConditions[0].Expression = "true"
		},
		"pod matchCondition added": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).MatchConditions = append(pods(m).MatchConditions, admissionregistrationv1.MatchCondition{Name: "more", Expression: "true"})
		},
		"UPDATE pods rule": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).Rules[0].Operations = append(pods(m).Rules[0].Operations, admissionregistrationv1.Update)
		},
		"UPDATE nodes rule": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).Rules[1].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
		},
		"DELETE nodes": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).Rules[1].Operations = append(nodes(m).Rules[1].Operations, admissionregistrationv1.Delete)
		},
		"pods/exec resource": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			pods(m).Rules[0].Resources = append(pods(m).Rules[0].Resources, "pods/exec")
		},
		"new resource (secrets)": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).Rules = append(nodes(m).Rules, admissionregistrationv1.RuleWithOperations{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}}})
		},
		"rules on any group": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).Rules[1].APIGroups = []string{"*"}
		},
		"node rules on pods": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			nodes(m).Rules[1].Resources = []string{"nodes", "pods"}
		},
		"a third webhook": func(m *admissionregistrationv1.MutatingWebhookConfiguration) {
			w := *nodes(m)
			w.Name = "more.overcommit.dev"
			m.Webhooks = append(m.Webhooks, w)
		},
	}
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestClusterKubectlApply: the documented install commands, with the kubectl of tests/cluster
// (kustomize built in): `kubectl apply --server-side -k deploy/` and `-k deploy/examples`, then
// `kubectl delete -k` of both.
func TestClusterKubectlApply(t *testing.T) {
	clusterConfig(t)
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "tests", "cluster", "kcp.sh"), append([]string{"kubectl"}, args...)...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := kubectl("apply", "--server-side", "-k", "deploy/")
	out += kubectl("apply", "--server-side", "-k", "deploy/examples")
	t.Logf("%s", out)
	for _, want := range []string{"deployment.apps/kube-overcommit serverside-applied", "overcommitpolicy.overcommit.dev/", "validatingadmissionpolicy.admissionregistration.k8s.io/kube-overcommit-webhook-guard serverside-applied"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl apply output lacks %q", want)
		}
	}
	kubectl("-n", "kube-overcommit", "rollout", "status", "deployment/kube-overcommit", "--timeout=2m")
	kubectl("delete", "-k", "deploy/examples", "--wait")
	kubectl("delete", "-k", "deploy/", "--wait", "--timeout=2m")
}

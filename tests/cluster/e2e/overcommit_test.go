package e2e

// Issue 3's end-to-end test: the webhook installed as replicas of the real binary (package
// install: the leader bootstraps the certificates and the MutatingWebhookConfiguration) on a
// control plane of its own, so that no other test's pods or webhooks touch its nodes.
//
//  1. An OvercommitPolicy created through the API inflates the fake nodes' allocatable at their
//     next status write (raw kept in overcommit.dev/raw-allocatable).
//  2. kube-scheduler binds more 1-CPU pods than the raw capacity holds: exactly the raw count
//     before, exactly the inflated count after (every other pod marked Unschedulable, so the
//     counts are what fits, not timing).
//  3. A node labelled overcommit.dev/disabled=true, then every node once the policy is deleted,
//     gets the kubelet's own value back and loses the annotations; later writes keep it.
//  4. Pod defaults in a labelled namespace; kube-system and unlabelled namespaces untouched.
//  5. The Lease holder alone exports kube_overcommit_node_raw_allocatable, the kubelet's cpu of
//     each inflated node, also after the Lease is handed to the other replica while both run;
//     a node's series goes when it loses the annotation.
//  7. `kubectl overcommit status` (status_test.go) shows the pool's policy, raw and written cpu
//     and the bound pods' requests.
//
// Throughout, no fake kubelet status write or registration fails. The API server presents a
// client certificate (its AdmissionConfiguration) and the replicas require one
// (--client-ca-file): a client without one, or with another CA's, is refused.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
	"kube-overcommit/tests/cluster/internal/annotations"
)

const (
	ocRawAnnotation     = annotations.Raw
	ocAppliedAnnotation = annotations.Applied
	ocDisabledLabel     = "overcommit.dev/disabled"
	ocPodDefaultsLabel  = "overcommit.dev/pod-defaults"
	ocPoolLabel         = "e2e-overcommit"
	ocPool              = "pool"
	ocNodeCPU           = 4  // raw cpu of each fake node
	ocNodes             = 2  // fake nodes in the pool
	ocRatio             = 2  // the policy's cpu ratio
	ocReplicas          = 20 // 1-CPU pods: more than even the inflated pool holds
)

var ocPolicies = schema.GroupVersionResource{Group: "overcommit.dev", Version: "v1alpha1", Resource: "overcommitpolicies"}

func TestOvercommit(t *testing.T) {
	ownControlPlane(t)
	start := time.Now()
	// The API server authenticates to the webhook with a client certificate, which the
	// replicas require (issue 19, item 7): every review below goes over that mutual TLS.
	auth := newWebhookClientAuth(t, install.DefaultService+"."+install.DefaultNamespace+".svc")
	c := harness.Start(t, harness.Options{APIServerArgs: auth.APIServerArgs})
	ctx := harness.Context(t, 4*time.Minute)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}

	in := installReplicas(t, ctx, c, append(slices.Clone(ocServeArgs), "--client-ca-file="+auth.CAFile)...)
	for _, r := range in.Replicas() {
		if err := auth.checkRefused(r.Listen); err != nil {
			t.Fatalf("replica %d: %v", r.Index, err)
		}
	}
	t.Logf("replicas require the API server's client certificate: none or another CA's is refused in the handshake")
	t.Logf("installed: %s (%.1fs)", in.Summary(), time.Since(start).Seconds())

	// Status writes every second; an unchanged (not inflated) node still reports every 3 s, so
	// a policy reaches a node within seconds instead of the kubelet's 5 minutes.
	nodeOpts := harness.FakeNodesOptions{Prefix: "oc", Count: ocNodes, Args: []string{
		fmt.Sprintf("--cpu=%d", ocNodeCPU), "--memory=16Gi", "--images=50",
		"--labels=" + ocPoolLabel + "=" + ocPool,
		"--status-update-frequency=1s", "--status-report-frequency=3s",
	}}
	nodes, err := c.StartFakeNodes(nodeOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	raw := fmt.Sprint(ocNodeCPU)
	inflated := fmt.Sprint(ocNodeCPU * ocRatio)
	for _, n := range nodes.Names {
		if err := waitNode(ctx, cs, n, 60*time.Second, nodeReady, cpuIs(raw), notAnnotated); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("nodes %v ready with cpu %s (%.1fs)", nodes.Names, raw, time.Since(start).Seconds())

	// 2a. Before any policy: exactly the raw capacity is bound, the rest is Unschedulable.
	ns := "oc-sched"
	ocNamespace(t, ctx, cs, ns, nil)
	if err := createPinnedDeployment(ctx, cs, ns, "cpu-hogs", ocReplicas); err != nil {
		t.Fatal(err)
	}
	rawFit := ocNodes * ocNodeCPU
	before, err := waitPlacement(ctx, cs, ns, rawFit, ocReplicas, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before the policy: %d of %d pods bound %v (raw capacity %d) (%.1fs)", rawFit, ocReplicas, before, rawFit, time.Since(start).Seconds())

	// 1. The policy, created through the API, inflates the pool at the next status write.
	policies := dyn.Resource(ocPolicies)
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": "oc-pool-cpu"},
		"spec": map[string]any{
			"priority":     int64(10),
			"nodeSelector": map[string]any{"matchLabels": map[string]any{ocPoolLabel: ocPool}},
			"nodeRatios":   map[string]any{"cpu": fmt.Sprint(ocRatio)},
			"podDefaults": map[string]any{
				"requests":              map[string]any{"cpu": "50m", "memory": "64Mi"},
				"requestToLimitPercent": map[string]any{"cpu": int64(25)},
			},
		},
	}}
	if _, err := policies.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Every replica's policy cache (a watch of the CRD) has it before anything is checked, so
	// that whichever replica the API server calls answers with it.
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Names {
		if err := waitNode(ctx, cs, n, 60*time.Second, cpuIs(inflated), rawAnnotation(raw), appliedPolicy("oc-pool-cpu")); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("policy applied: cpu %s -> %s on %v (%.1fs)", raw, inflated, nodes.Names, time.Since(start).Seconds())

	// 6. A kubelet that restarts POSTs its Node again; the API server runs mutating admission
	// before storage answers AlreadyExists, so the replicas count one patched node CREATE per
	// restart on an overcommitted node: the signal for docs/architecture.md §12's re-admission window
	// (OutOfcpu after a kubelet restart), shown by the dashboard's registrations panel.
	isNodeCreatePatched := func(k string) bool {
		return strings.Contains(k, `resource="node"`) && strings.Contains(k, `operation="CREATE"`) && strings.Contains(k, `outcome="patched"`)
	}
	createsBefore, err := sumReviews(in, isNodeCreatePatched)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes.Stop(); err != nil {
		t.Fatal(err)
	}
	if nodes, err = c.StartFakeNodes(nodeOpts); err != nil {
		t.Fatal(err)
	}
	var restartCreates float64
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		n, err := sumReviews(in, isNodeCreatePatched)
		if restartCreates = n - createsBefore; err == nil && restartCreates < ocNodes {
			err = fmt.Errorf("%v of %d", restartCreates, ocNodes)
		}
		return err
	})
	if err != nil || restartCreates != ocNodes {
		t.Fatalf("after restarting %d kubelets: %v patched node CREATE reviews (want %d): %v", ocNodes, restartCreates, ocNodes, err)
	}
	t.Logf("kubelets restarted: %v patched registrations counted (%.1fs)", restartCreates, time.Since(start).Seconds())

	// 5. The Lease holder, and only it, exports the kubelet's own cpu of every inflated node as
	// kube_overcommit_node_raw_allocatable (in cores); it follows the leadership when the Lease
	// is handed to the other replica while both keep running.
	rawCPU := map[string]float64{}
	for _, n := range nodes.Names {
		rawCPU[n+"/cpu"] = ocNodeCPU
	}
	leader, err := waitRawAllocatable(ctx, in, rawCPU, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader %s exports raw allocatable %v, the other replicas none (%.1fs)", leader.Identity(), rawCPU, time.Since(start).Seconds())
	if err := handLeaseTo(ctx, cs, in, otherReplica(in, leader)); err != nil {
		t.Fatal(err)
	}
	newLeader, err := waitRawAllocatable(ctx, in, rawCPU, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if newLeader == leader || !leader.Alive() {
		t.Fatalf("leadership not handed over live: leader %s (was %s, alive %v)", newLeader.Identity(), leader.Identity(), leader.Alive())
	}
	t.Logf("Lease handed to %s: it exports, %s (still running) exports none (%.1fs)", newLeader.Identity(), leader.Identity(), time.Since(start).Seconds())

	// 2b. The scheduler now binds up to the inflated capacity, and no further.
	inflatedFit := ocNodes * ocNodeCPU * ocRatio
	after, err := waitPlacement(ctx, cs, ns, inflatedFit, ocReplicas, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the policy: %d of %d pods bound %v (raw capacity %d, inflated %d) (%.1fs)", inflatedFit, ocReplicas, after, rawFit, inflatedFit, time.Since(start).Seconds())

	// 7. A person's view: `kubectl overcommit status` shows each node's policy, the kubelet's and
	// the written cpu, and what the bound pods request.
	if err := checkStatus(t, c, nodes.Names, after, "oc-pool-cpu", ocNodeCPU, ocNodeCPU*ocRatio); err != nil {
		t.Fatal(err)
	}

	// 4a. Pod defaults: a labelled namespace gets them; kube-system (even labelled) and an
	// unlabelled namespace do not. Pods are pinned to no node, so they use no pool capacity.
	ocNamespace(t, ctx, cs, "oc-defaults", map[string]string{ocPodDefaultsLabel: "enabled"})
	ocNamespace(t, ctx, cs, "oc-no-defaults", nil)
	if _, err := cs.CoreV1().Namespaces().Patch(ctx, "kube-system", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+ocPodDefaultsLabel+`":"enabled"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Every replica has the policy (waited on above), so the first pod of each namespace is
	// checked as created: no retrying until defaults appear.
	want := map[string]corev1.ResourceList{
		"plain":   {corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		"limited": {corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
	untouched := map[string]corev1.ResourceList{
		"plain":   {},
		"limited": {corev1.ResourceCPU: resource.MustParse("2")},
	}
	for _, tc := range []struct {
		ns   string
		want map[string]corev1.ResourceList
	}{{"oc-defaults", want}, {"kube-system", untouched}, {"oc-no-defaults", untouched}} {
		got, err := createDefaultsPod(ctx, cs, tc.ns)
		if err != nil {
			t.Fatal(err)
		}
		for name, w := range tc.want {
			if !sameResources(got[name], w) {
				t.Errorf("namespace %s, container %s: requests %v, want %v", tc.ns, name, got[name], w)
			}
		}
		t.Logf("pod in %s: requests %v", tc.ns, got)
	}

	// 4b. Opting a node out brings its raw value back at its next status write; the other
	// node stays inflated.
	optedOut, kept := nodes.Names[1], nodes.Names[0]
	if _, err := cs.CoreV1().Nodes().Patch(ctx, optedOut, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+ocDisabledLabel+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitNode(ctx, cs, optedOut, 60*time.Second, cpuIs(raw), notAnnotated); err != nil {
		t.Fatal(err)
	}
	if err := waitNode(ctx, cs, kept, 5*time.Second, cpuIs(inflated), rawAnnotation(raw)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s labelled %s=true: cpu back to %s; %s still %s (%.1fs)", optedOut, ocDisabledLabel, raw, kept, inflated, time.Since(start).Seconds())
	// The opted-out node lost the annotation: its series goes, the other stays.
	if _, err := waitRawAllocatable(ctx, in, map[string]float64{kept + "/cpu": ocNodeCPU}, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// 3. Deleting the policy restores the raw value and removes the annotations.
	if err := policies.Delete(ctx, "oc-pool-cpu", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 0); err != nil {
		t.Fatal(err)
	}
	if err := waitNode(ctx, cs, kept, 60*time.Second, cpuIs(raw), notAnnotated); err != nil {
		t.Fatal(err)
	}
	// ... and the writes after that keep it (no compounding, no stale raw value).
	st, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	mark := map[string]int64{}
	for _, n := range nodes.Names {
		mark[n] = st.PerNode[n].StatusWrites
	}
	if err := harness.Eventually(30*time.Second, 250*time.Millisecond, func() error {
		s, err := nodes.Stats()
		if err != nil {
			return err
		}
		for _, n := range nodes.Names {
			if s.PerNode[n] == nil || s.PerNode[n].StatusWrites < mark[n]+1 {
				return fmt.Errorf("%s: no status write since %d", n, mark[n])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Names {
		if err := waitNode(ctx, cs, n, time.Second, cpuIs(raw), notAnnotated); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("policy deleted: %v back to cpu %s without annotations, and stays there (%.1fs)", nodes.Names, raw, time.Since(start).Seconds())
	// No node is inflated any more: no series anywhere.
	if _, err := waitRawAllocatable(ctx, in, map[string]float64{}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("raw allocatable series gone with the annotations (%.1fs)", time.Since(start).Seconds())

	// Throughout: not one failed status write or registration, and the webhook did change writes.
	st, err = nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	w, r := st.StatusWrites, st.Registrations
	t.Logf("fake node stats: status writes %d (failures %d, overridden %d, mutated %d, max latency %.0f ms), registrations %d (failures %d)",
		w.Attempts, w.Failures, w.Overridden, w.Mutated, w.MaxLatencyMs, r.Attempts, r.Failures)
	if w.Failures != 0 || r.Failures != 0 || st.GetFailures != 0 {
		t.Fatalf("failed writes: status %d (last %q), registrations %d, gets %d", w.Failures, w.LastError, r.Failures, st.GetFailures)
	}
	if w.Overridden == 0 {
		t.Fatal("no status write was changed by the webhook")
	}
	// The replicas' own account: reviews of both kinds patched, none failed open.
	reviews, err := reviewsByLabels(in)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reviews (all replicas): %v", reviews)
	var nodePatched, podPatched, failedOpen float64
	for k, v := range reviews {
		switch {
		case strings.Contains(k, `outcome="failed_open"`):
			failedOpen += v
		case strings.Contains(k, `resource="node"`) && strings.Contains(k, `outcome="patched"`):
			nodePatched += v
		case strings.Contains(k, `resource="pod"`) && strings.Contains(k, `outcome="patched"`):
			podPatched += v
		}
	}
	if failedOpen != 0 || nodePatched == 0 || podPatched == 0 {
		t.Fatalf("reviews: %v failed open, %v node and %v pod reviews patched", failedOpen, nodePatched, podPatched)
	}
	t.Logf("TestOvercommit done in %.1fs", time.Since(start).Seconds())
}

// ocServeArgs: fast leader election and certificate checks, a short shutdown.
// startWithReplicas starts a control plane of the test's own with 2 replicas installed
// (ocServeArgs), a context of the given length, and a dynamic client for policies.
func startWithReplicas(t *testing.T, length time.Duration) (*harness.Cluster, context.Context, dynamic.Interface, *install.Installation) {
	t.Helper()
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, length)
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	return c, ctx, dyn, installReplicas(t, ctx, c, ocServeArgs...)
}

var ocServeArgs = []string{"--lease-ttl=4s", "--lease-renew=1s", "--check-interval=1s", "--shutdown-grace=5s"}

// installReplicas installs 2 replicas of the binary with the CRD on the test's own control
// plane, waits until they are bootstrapped, and uninstalls them at the end (their logs shown
// when the test failed).
func installReplicas(t *testing.T, ctx context.Context, c *harness.Cluster, args ...string) *install.Installation {
	t.Helper()
	in, err := install.Install(ctx, c, install.Options{Replicas: 2, CRD: install.DefaultCRD(), SecretDelay: time.Second, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range in.LogPaths() {
				tailLog(t, p, 40)
			}
		}
		if err := in.Uninstall(context.Background(), false); err != nil {
			t.Error(err)
		}
	})
	if err := in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	return in
}

// ocNamespace creates a namespace of this test's control plane (deleted at the end).
func ocNamespace(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	// The ServiceAccount admission plugin refuses pods until the controller manager has
	// created the namespace's default ServiceAccount.
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("namespace %s: default ServiceAccount: %v", name, err)
	}
}

// createPinnedDeployment: pods of 1 CPU that only the pool's nodes can take.
func createPinnedDeployment(ctx context.Context, cs kubernetes.Interface, ns, name string, replicas int32) error {
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{ocPoolLabel: ocPool},
					TerminationGracePeriodSeconds: ptr.To(int64(0)),
					Containers: []corev1.Container{{
						Name:  "hog",
						Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
						},
					}},
				},
			},
		},
	}
	_, err := cs.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{})
	return err
}

// waitPlacement waits until all `total` pods exist and each is either bound or marked
// Unschedulable by the scheduler, then requires exactly `bound` bound ones. Because every pod
// has been tried, the count is what fits, not how far the scheduler got.
func waitPlacement(ctx context.Context, cs kubernetes.Interface, ns string, bound, total int, timeout time.Duration) (map[string]int, error) {
	var perNode map[string]int
	var last string
	err := harness.Eventually(timeout, 250*time.Millisecond, func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		perNode = map[string]int{}
		n, unschedulable := 0, 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			n++
			if p.Spec.NodeName != "" {
				perNode[p.Spec.NodeName]++
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					unschedulable++
				}
			}
		}
		b := 0
		for _, v := range perNode {
			b += v
		}
		last = fmt.Sprintf("%d pods, %d bound %v, %d unschedulable", n, b, perNode, unschedulable)
		if n != total || b+unschedulable != total || b < bound {
			return fmt.Errorf("not settled: %s", last)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	b := 0
	for _, v := range perNode {
		b += v
	}
	if b != bound {
		return perNode, fmt.Errorf("%d pods bound, want exactly %d: %s", b, bound, last)
	}
	return perNode, nil
}

// createDefaultsPod creates a pod (pinned to no node) with a container without resources and
// one with only a cpu limit of 2, and returns the stored requests per container.
func createDefaultsPod(ctx context.Context, cs kubernetes.Interface, ns string) (map[string]corev1.ResourceList, error) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "oc-defaults-"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{ocPoolLabel: "nowhere"},
			Containers: []corev1.Container{
				{Name: "plain", Image: "registry.k8s.io/pause:3.10"},
				{Name: "limited", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
				}},
			},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod in %s: %w", ns, err)
	}
	defer func() {
		_ = cs.CoreV1().Pods(ns).Delete(context.Background(), created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}()
	got := map[string]corev1.ResourceList{}
	for _, c := range created.Spec.Containers {
		got[c.Name] = c.Resources.Requests
	}
	return got, nil
}

func sameResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		x, ok := a[k]
		if !ok || x.Cmp(v) != 0 {
			return false
		}
	}
	return true
}

// nodeCheck is one condition on a stored Node.
type nodeCheck func(*corev1.Node) error

func waitNode(ctx context.Context, cs kubernetes.Interface, name string, timeout time.Duration, checks ...nodeCheck) error {
	var last error
	err := harness.Eventually(timeout, 200*time.Millisecond, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				last = err
			}
			return err
		}
		for _, check := range checks {
			if err := check(n); err != nil {
				last = fmt.Errorf("node %s: %w", name, err)
				return last
			}
		}
		return nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

func nodeReady(n *corev1.Node) error {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("not Ready")
}

func cpuIs(want string) nodeCheck {
	return func(n *corev1.Node) error {
		got := n.Status.Allocatable[corev1.ResourceCPU]
		if got.Cmp(resource.MustParse(want)) != 0 {
			return fmt.Errorf("allocatable cpu %s, want %s", got.String(), want)
		}
		if c := n.Status.Capacity[corev1.ResourceCPU]; c.Cmp(resource.MustParse(fmt.Sprint(ocNodeCPU))) != 0 {
			return fmt.Errorf("capacity cpu changed to %s", c.String())
		}
		return nil
	}
}

func notAnnotated(n *corev1.Node) error {
	for _, k := range []string{ocRawAnnotation, ocAppliedAnnotation} {
		if v, ok := n.Annotations[k]; ok {
			return fmt.Errorf("annotation %s=%s still there", k, v)
		}
	}
	return nil
}

func rawAnnotation(cpu string) nodeCheck {
	return func(n *corev1.Node) error {
		raw, err := annotations.ParseRaw(n.Annotations[ocRawAnnotation])
		if err != nil {
			return err
		}
		q, err := resource.ParseQuantity(raw["cpu"])
		if err != nil || q.Cmp(resource.MustParse(cpu)) != 0 {
			return fmt.Errorf("annotation %s=%q, want cpu %s", ocRawAnnotation, n.Annotations[ocRawAnnotation], cpu)
		}
		return nil
	}
}

func appliedPolicy(name string) nodeCheck {
	return func(n *corev1.Node) error {
		v := n.Annotations[ocAppliedAnnotation]
		if applied, err := annotations.ParseApplied(v); err != nil || applied.Policy != name {
			return fmt.Errorf("annotation %s=%q, want policy %s", ocAppliedAnnotation, v, name)
		}
		return nil
	}
}

// replicaMetrics reads a replica's /metrics (Prometheus text) into series -> value.
// reviewsByLabels sums kube_overcommit_reviews_total over the replicas, by label set.
func reviewsByLabels(in *install.Installation) (map[string]float64, error) {
	reviews := map[string]float64{}
	for _, r := range in.Replicas() {
		m, err := replicaMetrics(r)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			if strings.HasPrefix(k, "kube_overcommit_reviews_total{") && v != 0 {
				reviews[k] += v
			}
		}
	}
	return reviews, nil
}

// sumReviews is the sum over the replicas of the reviews counters whose labels match.
func sumReviews(in *install.Installation, match func(labels string) bool) (float64, error) {
	reviews, err := reviewsByLabels(in)
	var sum float64
	for k, v := range reviews {
		if match(k) {
			sum += v
		}
	}
	return sum, err
}

func replicaMetrics(r *install.Replica) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.Probe + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("replica %s /metrics: %s", r.Identity(), resp.Status)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, nil
}

// waitPoliciesLoaded waits until every replica's policy set holds n policies.
func waitPoliciesLoaded(in *install.Installation, n int) error {
	return harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		for _, r := range in.Replicas() {
			m, err := replicaMetrics(r)
			if err != nil {
				return err
			}
			if got, ok := m["kube_overcommit_policies_loaded"]; !ok || got != float64(n) {
				return fmt.Errorf("replica %s: policies loaded %v (present %v), want %d", r.Identity(), got, ok, n)
			}
		}
		return nil
	})
}

// rawAllocatableSeries reads a replica's kube_overcommit_node_raw_allocatable as
// "node/resource" -> value.
func rawAllocatableSeries(r *install.Replica) (map[string]float64, error) {
	m, err := replicaMetrics(r)
	if err != nil {
		return nil, err
	}
	label := func(labels, name string) string {
		_, v, _ := strings.Cut(labels, name+`="`)
		v, _, _ = strings.Cut(v, `"`)
		return v
	}
	out := map[string]float64{}
	for k, v := range m {
		if labels, ok := strings.CutPrefix(k, "kube_overcommit_node_raw_allocatable{"); ok {
			out[label(labels, "node")+"/"+label(labels, "resource")] = v
		}
	}
	return out, nil
}

// waitRawAllocatable waits until the Lease holder exports exactly want and every other replica
// exports no series, and returns the holder.
func waitRawAllocatable(ctx context.Context, in *install.Installation, want map[string]float64, timeout time.Duration) (*install.Replica, error) {
	var leader *install.Replica
	err := harness.Eventually(timeout, 200*time.Millisecond, func() error {
		leader = in.Leader(ctx)
		if leader == nil {
			return fmt.Errorf("no replica holds the Lease")
		}
		for _, r := range in.Replicas() {
			got, err := rawAllocatableSeries(r)
			if err != nil {
				return err
			}
			if r == leader && !maps.Equal(got, want) {
				return fmt.Errorf("leader %s exports %v, want %v", r.Identity(), got, want)
			}
			if r != leader && len(got) != 0 {
				return fmt.Errorf("replica %s does not lead and exports %v", r.Identity(), got)
			}
		}
		return nil
	})
	return leader, err
}

func otherReplica(in *install.Installation, not *install.Replica) *install.Replica {
	for _, r := range in.Replicas() {
		if r != not {
			return r
		}
	}
	return nil
}

// handLeaseTo makes `to` the holder of the leader Lease while the old holder keeps running:
// at its next renewal the old holder finds the Lease held by another and steps down, and `to`
// finds itself the holder and renews.
func handLeaseTo(ctx context.Context, cs kubernetes.Interface, in *install.Installation, to *install.Replica) error {
	if to == nil {
		return fmt.Errorf("no other replica to hand the Lease to")
	}
	patch := fmt.Sprintf(`{"spec":{"holderIdentity":%q,"renewTime":%q}}`, to.Identity(), time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"))
	_, err := cs.CoordinationV1().Leases(in.Namespace).Patch(ctx, in.LeaseName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

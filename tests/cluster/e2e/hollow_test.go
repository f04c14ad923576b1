package e2e

// Hollow nodes: Kubernetes' own kubelet (kubemark's hollow kubelet built from k8s.io/kubernetes
// v1.36.3, `kcp hollow-nodes`, harness.StartHollowNodes) on a control plane of the test's own,
// with the API server's audit log recording every kubelet request on nodes and Leases.
//
//  1. Two hollow kubelets register and go Ready, without any address in status.addresses.
//  2. Quiet: with nothing changing, each kubelet GETs its Node every nodeStatusUpdateFrequency
//     (2 s here) but PATCHes nodes/status only when nodeStatusReportFrequency has passed (20 s
//     here instead of the default 5 min, to keep the test short: the rule is the same), and
//     renews its Lease every quarter of its 40 s duration. This is issue 33's baseline: a
//     policy reaches a quiet node only at its next report.
//  3. The kubelet's own admission: a pod bound to a node with more cpu than its raw
//     allocatable fails with OutOfcpu (capacity 4000m in the message).
//  4. kube-overcommit installed (2 replicas) and a policy (cpu x2) selecting the hollow nodes:
//     the stored allocatable becomes 8 at the kubelet's next status PATCH (time measured from
//     the policy's creation); then a pod of 6 cpu bound to a node is admitted by the kubelet
//     and Running (fake runtime), and one of 9 cpu is refused against the inflated 8000m.
//  5. Nothing dials a hollow node: the API server's node proxy finds no address, and
//     metrics-server (started first, scraping every 10 s) names the fake node-0 it fails to
//     scrape but never a hollow node (its node selector excludes hollownode.Label).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/hollownode"
)

const (
	hollowUpdate = 2 * time.Second  // nodeStatusUpdateFrequency in this test (default 10 s)
	hollowReport = 20 * time.Second // nodeStatusReportFrequency in this test (default 5 min)
	hollowLease  = 40 * time.Second // nodeLeaseDurationSeconds (the default): renewed every 10 s
	hollowPool   = "e2e-hollow"
)

// hollowAuditPolicy logs (metadata only) the requests on Nodes and Leases that a kubelet makes.
const hollowAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["get", "create", "patch", "update"]
  resources:
  - group: ""
    resources: ["nodes", "nodes/status"]
  - group: coordination.k8s.io
    resources: ["leases"]
- level: None
`

func TestHollowNodes(t *testing.T) {
	ownControlPlane(t)
	start := time.Now()
	dir := t.TempDir()
	policyFile, auditLog := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policyFile, []byte(hollowAuditPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	// node-0, a fake kubelet without resource metrics, is what metrics-server does scrape.
	c := harness.Start(t, harness.Options{Nodes: 1, APIServerArgs: []string{
		"--audit-policy-file=" + policyFile, "--audit-log-path=" + auditLog}})
	ctx := harness.Context(t, 4*time.Minute)
	cs := c.Client
	ms, err := c.StartMetricsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Stop() })

	writes := watchNodes(t, ctx, cs)
	nodes := startHollow(t, ctx, c, start)
	quietFrom := time.Now()
	checkQuiet(t, c.RunDir, auditLog, nodes.Names, quietFrom)
	quiet := [2]time.Time{quietFrom, time.Now()}

	ns := "hollow-pods"
	ocNamespace(t, ctx, cs, ns, nil)
	if err := admissionRefused(ctx, cs, ns, "raw-too-big", nodes.Names[0], "6", "capacity: 4000"); err != nil {
		t.Fatal(err)
	}
	t.Logf("before any policy: the kubelet refuses a 6-cpu pod on a 4-cpu node (OutOfcpu) (%.1fs)", time.Since(start).Seconds())

	in := installReplicas(t, ctx, c, ocServeArgs...)
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	created := createHollowPolicy(t, ctx, dyn)
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	checkInflated(t, ctx, cs, auditLog, nodes.Names, created)
	checkQuietWrites(t, writes, nodes.Names, quiet)

	if err := admittedRunning(ctx, cs, ns, "fits-inflated", nodes.Names[0], "6"); err != nil {
		t.Fatal(err)
	}
	if err := admissionRefused(ctx, cs, ns, "inflated-too-big", nodes.Names[1], "9", "capacity: 8000"); err != nil {
		t.Fatal(err)
	}
	t.Logf("inflated: the kubelet admits a 6-cpu pod (Running) and refuses a 9-cpu one against 8000m (%.1fs)", time.Since(start).Seconds())

	checkNothingDials(t, ctx, c, nodes.Names)
	t.Logf("TestHollowNodes done in %.1fs", time.Since(start).Seconds())
}

// startHollow starts 2 hollow kubelets of 4 cpu in the pool and checks what they registered.
func startHollow(t *testing.T, ctx context.Context, c *harness.Cluster, start time.Time) *harness.HollowNodes {
	t.Helper()
	nodes, err := c.StartHollowNodes(harness.HollowNodesOptions{Count: 2, Args: []string{
		"--cpu=4", "--memory=8Gi", "--labels=" + ocPoolLabel + "=" + hollowPool,
		"--status-update-frequency=" + hollowUpdate.String(), "--status-report-frequency=" + hollowReport.String(),
		"--lease-duration=" + hollowLease.String(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	if err := nodes.WaitReady(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, name := range nodes.Names {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case len(n.Status.Addresses) != 0:
			t.Fatalf("%s reports addresses %v: nothing may be able to dial a hollow node", name, n.Status.Addresses)
		case n.Labels[hollownode.Label] != "true" || n.Labels[ocPoolLabel] != hollowPool:
			t.Fatalf("%s labels %v", name, n.Labels)
		case n.Status.NodeInfo.KubeletVersion != "v1.36.3" || !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "fakeRuntime://"):
			t.Fatalf("%s node info %+v: not the v1.36.3 kubelet on the fake runtime", name, n.Status.NodeInfo)
		}
		if err := cpuIs("4")(n); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	t.Logf("hollow kubelets %v Ready, cpu 4, no address (%.1fs)", nodes.Names, time.Since(start).Seconds())
	return nodes
}

// kubeletRequest is one request by a node's identity, from the audit log.
type kubeletRequest struct {
	at       time.Time
	node     string
	verb     string
	resource string // nodes, nodes/status, leases
	code     int32
}

// readKubeletRequests reads the audit log: the completed requests made as system:node:<name>.
func readKubeletRequests(path string) ([]kubeletRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []kubeletRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev auditv1.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("audit line: %w", err)
		}
		user := ev.User.Username
		if ev.ImpersonatedUser != nil {
			user = ev.ImpersonatedUser.Username
		}
		node, ok := strings.CutPrefix(user, "system:node:")
		if !ok || ev.Stage != auditv1.StageResponseComplete || ev.ObjectRef == nil {
			continue
		}
		r := kubeletRequest{at: ev.RequestReceivedTimestamp.Time, node: node, verb: ev.Verb, resource: ev.ObjectRef.Resource}
		if ev.ObjectRef.Subresource != "" {
			r.resource += "/" + ev.ObjectRef.Subresource
		}
		if ev.ResponseStatus != nil {
			r.code = ev.ResponseStatus.Code
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// requestsOf are node's requests with this verb and resource from since on.
func requestsOf(all []kubeletRequest, node, verb, res string, since time.Time) []kubeletRequest {
	var out []kubeletRequest
	for _, r := range all {
		if r.node == node && r.verb == verb && r.resource == res && !r.at.Before(since) {
			out = append(out, r)
		}
	}
	return out
}

// checkQuiet waits until each node has PATCHed its status 3 times since from (at least two
// report periods) and checks the kubelet's rhythm: a status sync every update period (the
// kubelet reads its Node from its informer, so the syncs are counted in its log: each one
// logs the refused loopback node IP), a status PATCH only when the report period (jittered by
// the kubelet to 0.5-1.5 of it after a change, then exact) has passed, a Lease renewal every
// quarter of its duration.
func checkQuiet(t *testing.T, runDir string, auditLog string, names []string, from time.Time) {
	t.Helper()
	var reqs []kubeletRequest
	err := harness.Eventually(3*hollowReport+30*time.Second, time.Second, func() error {
		var err error
		if reqs, err = readKubeletRequests(auditLog); err != nil {
			return err
		}
		for _, n := range names {
			if got := len(requestsOf(reqs, n, "patch", "nodes/status", from)); got < 3 {
				return fmt.Errorf("%s: %d status PATCHes since %s", n, got, from.Format(time.TimeOnly))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		patches := requestsOf(reqs, n, "patch", "nodes/status", from)
		window := patches[len(patches)-1].at.Sub(from)
		syncs, err := kubeletSyncs(filepath.Join(runDir, "logs", "hollow-node-"+n+".log"), from, patches[len(patches)-1].at)
		if err != nil {
			t.Fatal(err)
		}
		renewals := requestsOf(reqs, n, "update", "leases", from)
		var gaps []string
		for i := 1; i < len(patches); i++ {
			gap := patches[i].at.Sub(patches[i-1].at)
			gaps = append(gaps, gap.Round(100*time.Millisecond).String())
			if gap < hollowReport/2-hollowUpdate || gap > 3*hollowReport/2+2*hollowUpdate {
				t.Errorf("%s: status PATCHes %s apart: not the report period %s", n, gap, hollowReport)
			}
		}
		if min := int(0.7 * float64(window/hollowUpdate)); syncs < min {
			t.Errorf("%s: %d status syncs in %s, want >= %d (one every %s)", n, syncs, window, min, hollowUpdate)
		}
		if min := int(0.7 * float64(window/(hollowLease/4))); len(renewals) < min {
			t.Errorf("%s: %d Lease renewals in %s, want >= %d (one every %s)", n, len(renewals), window, min, hollowLease/4)
		}
		t.Logf("%s quiet for %s: %d status syncs, %d status PATCHes (gaps %s), %d Lease renewals",
			n, window.Round(time.Second), syncs, len(patches), strings.Join(gaps, " "), len(renewals))
	}
}

// syncMarker is what the kubelet logs at each status sync of a hollow node (package
// hollowkubelet: the loopback node IP it refuses).
const syncMarker = "failed to validate nodeIP: nodeIP can't be loopback address"

// kubeletSyncs counts the status syncs in a kubelet's log (klog lines "E1128 20:01:04.459260
// ...", local time) from from to to.
func kubeletSyncs(path string, from, to time.Time) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if len(line) < 21 || !strings.Contains(line, syncMarker) {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", path, line[:21], err)
		}
		at = at.AddDate(from.Year(), 0, 0)
		if !at.Before(from) && !at.After(to) {
			n++
		}
	}
	return n, nil
}

// createHollowPolicy creates the policy doubling the pool's cpu; it returns when it did.
func createHollowPolicy(t *testing.T, ctx context.Context, dyn dynamic.Interface) time.Time {
	t.Helper()
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": "hollow-cpu"},
		"spec": map[string]any{
			"priority":     int64(10),
			"nodeSelector": map[string]any{"matchLabels": map[string]any{ocPoolLabel: hollowPool}},
			"nodeRatios":   map[string]any{"cpu": "2"},
		},
	}}
	if _, err := dyn.Resource(ocPolicies).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// checkInflated waits until each node's stored cpu is 8 (raw 4 kept in the annotation) and
// checks, in the audit log, that a status PATCH of its kubelet came between the policy's
// creation and then: the webhook acts on the kubelet's own writes.
func checkInflated(t *testing.T, ctx context.Context, cs kubernetes.Interface, auditLog string, names []string, created time.Time) {
	t.Helper()
	for _, n := range names {
		if err := waitNode(ctx, cs, n, 3*hollowReport/2+30*time.Second, cpuIs("8"), rawAnnotation("4"), appliedPolicy("hollow-cpu")); err != nil {
			t.Fatal(err)
		}
		seen := time.Now()
		reqs, err := readKubeletRequests(auditLog)
		if err != nil {
			t.Fatal(err)
		}
		var first *kubeletRequest
		for _, p := range requestsOf(reqs, n, "patch", "nodes/status", created) {
			if p.code == 200 && !p.at.After(seen) {
				first = &p
				break
			}
		}
		if first == nil {
			t.Fatalf("%s inflated without a status PATCH of its kubelet since the policy", n)
		}
		t.Logf("%s: cpu 4 -> 8 at its kubelet's status PATCH %.1fs after the policy was created (seen after %.1fs; report period %s)",
			n, first.at.Sub(created).Seconds(), seen.Sub(created).Seconds(), hollowReport)
	}
}

// hollowPod is a pod bound to node (no scheduler: only the kubelet's admission decides) with
// cpu requested and no service-account token.
func hollowPod(ns, name, node, cpu string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: node, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}},
		},
	}
}

// admissionRefused creates the pod and waits until the kubelet fails it with OutOfcpu and a
// message containing want.
func admissionRefused(ctx context.Context, cs kubernetes.Interface, ns, name, node, cpu, want string) error {
	return createPodUntil(ctx, cs, hollowPod(ns, name, node, cpu), func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "OutOfcpu" && strings.Contains(p.Status.Message, want)
	}, "Failed OutOfcpu with "+want)
}

// admittedRunning creates the pod and waits until the kubelet runs it.
func admittedRunning(ctx context.Context, cs kubernetes.Interface, ns, name, node, cpu string) error {
	return createPodUntil(ctx, cs, hollowPod(ns, name, node, cpu), func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	}, "Running")
}

// createPodUntil creates pod and waits up to 30 s until done(stored pod) holds.
func createPodUntil(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, done func(*corev1.Pod) bool, want string) error {
	pods := cs.CoreV1().Pods(pod.Namespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	return harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !done(p) {
			return fmt.Errorf("pod %s: phase %s reason %q message %q, want %s", pod.Name, p.Status.Phase, p.Status.Reason, p.Status.Message, want)
		}
		return nil
	})
}

// checkNothingDials: the API server cannot proxy to a hollow node (no address), and
// metrics-server, which logs every node it fails to scrape (node-0), never names one.
func checkNothingDials(t *testing.T, ctx context.Context, c *harness.Cluster, names []string) {
	t.Helper()
	for _, n := range names {
		body, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + n + "/proxy/healthz").DoRaw(ctx)
		if err == nil || !strings.Contains(string(body), "no preferred addresses found") {
			t.Fatalf("node proxy to %s: %v %s, want a refusal for want of an address", n, err, body)
		}
	}
	msLog := filepath.Join(c.RunDir, "logs", "metrics-server.log")
	var text string
	if err := harness.Eventually(60*time.Second, time.Second, func() error {
		data, err := os.ReadFile(msLog)
		text = string(data)
		if err != nil || !strings.Contains(text, `node="node-0"`) {
			return fmt.Errorf("metrics-server has not logged a scrape of node-0 yet (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.Contains(text, n) {
			t.Fatalf("metrics-server's log names hollow node %s:\n%s", n, text)
		}
	}
	t.Logf("nothing dials the hollow nodes: node proxy refused (no address); metrics-server scraped node-0 only")
}

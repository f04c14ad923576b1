package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	metricsclient "k8s.io/metrics/pkg/client/clientset/versioned"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

// scrape is metrics-server's --metric-resolution as `kcp metrics-server` sets it.
const scrape = 10 * time.Second

// TestMetricsServer: the real metrics-server, registered through APIService
// v1beta1.metrics.k8s.io on the shared control plane's aggregator, scrapes two fake kubelets'
// /metrics/resource over TLS (verified with the run's CA); the usage scripted by annotations
// shows in NodeMetrics and PodMetrics read through the API server; a change shows within two
// scrape intervals; with metrics-server stopped the API answers 503.
func TestMetricsServer(t *testing.T) {
	onShared(t)
	c := shared
	ctx := harness.Context(t, 3*time.Minute)
	created, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := created.Name
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "metrics", Count: 2,
		Args: []string{"--resource-metrics", "--delete-on-exit", "--cpu=4", "--memory=8Gi"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	busyNode, idleNode := nodes.Names[0], nodes.Names[1]

	// Each fake kubelet publishes its own port for metrics-server (--kubelet-use-node-status-port).
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		ports := map[int32]bool{}
		for _, n := range nodes.Names {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			p := node.Status.DaemonEndpoints.KubeletEndpoint.Port
			if p == 10250 || p == 0 || ports[p] {
				return fmt.Errorf("%s: kubelet port %d (want its own)", n, p)
			}
			ports[p] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Scripted load: busy node = its pod (2 containers) + 250m/1Gi of system usage.
	annotate := func(obj string, usage string) {
		t.Helper()
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, fakenode.UsageAnnotation, usage)
		var err error
		if obj == busyNode {
			_, err = c.Client.CoreV1().Nodes().Patch(ctx, obj, types.MergePatchType, patch, metav1.PatchOptions{})
		} else {
			_, err = c.Client.CoreV1().Pods(ns).Patch(ctx, obj, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, node, usage string, containers ...string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{fakenode.UsageAnnotation: usage}},
			Spec: corev1.PodSpec{NodeName: node}}
		for _, cn := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: cn, Image: "registry.example.invalid/app:1"})
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(busyNode, `{"cpu":"250m","memory":"1Gi"}`)
	pod("busy", busyNode, `{"cpu":"500m","memory":"200Mi"}`, "app", "sidecar")
	pod("idle", idleNode, `{"cpu":"100m","memory":"50Mi"}`, "app")

	// Leave the shared control plane without metrics.k8s.io (an unavailable APIService makes
	// discovery clients such as kubectl warn), after metrics-server stopped.
	t.Cleanup(func() {
		for _, args := range [][]string{
			{"delete", "apiservice", "v1beta1.metrics.k8s.io", "--ignore-not-found"},
			{"delete", "-n", "kube-system", "service", "metrics-server", "--ignore-not-found"},
			{"delete", "-n", "kube-system", "endpointslice", "metrics-server-kcp", "--ignore-not-found"},
		} {
			if out, err := c.Kubectl(args...); err != nil {
				t.Errorf("kubectl %v: %v\n%s", args, err, out)
			}
		}
	})
	ms, err := c.StartMetricsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Stop() })
	mc, err := metricsclient.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	node := func(name, cpu, memory string) func() error {
		return func() error {
			m, err := mc.MetricsV1beta1().NodeMetricses().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return near(name, m.Usage, cpu, memory)
		}
	}
	podMetrics := func(name string, want map[string][2]string) func() error {
		return func() error {
			m, err := mc.MetricsV1beta1().PodMetricses(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(m.Containers) != len(want) {
				return fmt.Errorf("pod %s: %d containers, want %d", name, len(m.Containers), len(want))
			}
			for _, ctr := range m.Containers {
				w, ok := want[ctr.Name]
				if !ok {
					return fmt.Errorf("pod %s: unexpected container %s", name, ctr.Name)
				}
				if err := near(name+"/"+ctr.Name, ctr.Usage, w[0], w[1]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	all := func(fs ...func() error) func() error {
		return func() error {
			for _, f := range fs {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		}
	}
	start := time.Now()
	// The API service becomes available, metrics-server scrapes twice (a cpu rate needs two
	// points) and serves the scripted usage.
	if err := harness.Eventually(60*time.Second, 500*time.Millisecond, all(
		node(busyNode, "750m", "1224Mi"),
		node(idleNode, "100m", "50Mi"),
		podMetrics("busy", map[string][2]string{"app": {"250m", "100Mi"}, "sidecar": {"250m", "100Mi"}}),
		podMetrics("idle", map[string][2]string{"app": {"100m", "50Mi"}}),
	)); err != nil {
		t.Fatal(err)
	}
	t.Logf("scripted usage served through metrics.k8s.io %v after metrics-server started", time.Since(start).Round(time.Millisecond))

	// Raise the busy pod's usage: the node's and pod's metrics follow within two scrapes.
	annotate("busy", `{"cpu":"2","memory":"1Gi"}`)
	changed := time.Now()
	// Two scrapes, plus a second for the API round trips on a loaded machine.
	if err := harness.Eventually(2*scrape+time.Second, 250*time.Millisecond, all(
		node(busyNode, "2250m", "2Gi"),
		podMetrics("busy", map[string][2]string{"app": {"1", "512Mi"}, "sidecar": {"1", "512Mi"}}),
	)); err != nil {
		t.Fatal(err)
	}
	t.Logf("changed usage visible %v after the annotation changed", time.Since(changed).Round(time.Millisecond))

	// `kube-overcommit status` shows the same usage, read from metrics.k8s.io, with its share
	// of the node's cpu (4) and memory (8Gi).
	noPolicies := filepath.Join(t.TempDir(), "none.yaml")
	if err := os.WriteFile(noPolicies, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(2*scrape, 500*time.Millisecond, func() error {
		rows, _, err := statusJSON(c, "--policy-file", noPolicies)
		if err != nil {
			return err
		}
		want := map[string][2]string{busyNode: {"2250m", "2Gi"}, idleNode: {"100m", "50Mi"}}
		seen := 0
		for _, r := range rows {
			w, ok := want[r.Node]
			if !ok {
				continue
			}
			seen++
			cpu, mem := r.Resources["cpu"], r.Resources["memory"]
			if cpu.Usage == nil || mem.Usage == nil {
				return fmt.Errorf("%s: no usage in status", r.Node)
			}
			usage := corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewMilliQuantity(*cpu.Usage, resource.DecimalSI),
				corev1.ResourceMemory: *resource.NewQuantity(*mem.Usage, resource.BinarySI),
			}
			if err := near("status "+r.Node, usage, w[0], w[1]); err != nil {
				return err
			}
			if r.Policy != "-" || cpu.Raw == nil || *cpu.Raw != 4000 {
				return fmt.Errorf("%s: policy %q, cpu raw %v (want -, 4000)", r.Node, r.Policy, cpu.Raw)
			}
		}
		if seen != len(want) {
			return fmt.Errorf("status rows for %d of %v", seen, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-overcommit status shows the scripted usage")

	// metrics-server stopped (SIGTERM), then crashed (SIGKILL, its backend left behind): the
	// aggregated API answers 503 Service Unavailable.
	httpClient, err := rest.HTTPClientFor(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	status := func(want int) func() error {
		return func() error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+"/apis/metrics.k8s.io/v1beta1/nodes", nil)
			if err != nil {
				return err
			}
			res, err := httpClient.Do(req)
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
			res.Body.Close()
			if res.StatusCode != want {
				return fmt.Errorf("GET /apis/metrics.k8s.io/v1beta1/nodes: %s %s, want %d", res.Status, body, want)
			}
			return nil
		}
	}
	if err := ms.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := harness.Eventually(30*time.Second, 250*time.Millisecond, status(http.StatusServiceUnavailable)); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.MetricsV1beta1().NodeMetricses().Get(ctx, busyNode, metav1.GetOptions{}); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("NodeMetrics with metrics-server stopped: %v, want ServiceUnavailable", err)
	}
	t.Logf("503 %v after metrics-server stopped", time.Since(stopped).Round(time.Millisecond))
	// status without usage, saying why, and still answering.
	rows, stderr, err := statusJSON(c, "--policy-file", noPolicies)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "note: no usage: metrics.k8s.io is unavailable") {
		t.Fatalf("status with metrics-server stopped: stderr %q", stderr)
	}
	for _, r := range rows {
		if u := r.Resources["cpu"].Usage; u != nil {
			t.Fatalf("%s: usage %d with metrics-server stopped", r.Node, *u)
		}
	}

	ms, err = c.StartMetricsServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ms.Stop() })
	// Its first scrape, then the aggregator's availability check: 60 s, as a loaded 2-core host
	// has taken over 30 s.
	restarted := time.Now()
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, status(http.StatusOK)); err != nil {
		t.Fatal(err)
	}
	t.Logf("200 %v after metrics-server started again", time.Since(restarted).Round(time.Millisecond))
	ms.Kill()
	killed := time.Now()
	if err := harness.Eventually(30*time.Second, 250*time.Millisecond, status(http.StatusServiceUnavailable)); err != nil {
		t.Fatal(err)
	}
	t.Logf("503 %v after metrics-server was killed", time.Since(killed).Round(time.Millisecond))
}

// near checks usage against the wanted cpu (within 5%: a rate over a scrape window) and memory
// (a gauge: exact).
func near(what string, usage corev1.ResourceList, cpu, memory string) error {
	wantCPU, wantMem := resource.MustParse(cpu), resource.MustParse(memory)
	gotCPU, gotMem := usage[corev1.ResourceCPU], usage[corev1.ResourceMemory]
	if math.Abs(float64(gotCPU.MilliValue()-wantCPU.MilliValue())) > 0.05*float64(wantCPU.MilliValue()) {
		return fmt.Errorf("%s: cpu %s, want %s +-5%%", what, gotCPU.String(), cpu)
	}
	if gotMem.Cmp(wantMem) != 0 {
		return fmt.Errorf("%s: memory %s, want %s", what, gotMem.String(), memory)
	}
	return nil
}

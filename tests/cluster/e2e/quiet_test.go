package e2e

// Quiet heartbeats end to end (`kube-overcommit serve --heartbeat-refresh 5m`, the kubelet's
// report frequency, as the README recommends; serve's default is off): on a node the webhook
// inflates, the kubelet PATCHes its status every 10 s (its computed allocatable
// never equals the stored one), and the webhook makes each PATCH that only renews heartbeats
// equal to the stored node, so the API server's storage skips it. One control plane of the
// test's own (so that nothing else writes its nodes), 2 replicas of the real binary, 3 fake
// kubelets at the kubelet's defaults (status update 10 s, report 5 min, Lease renewed every
// 10 s), and a policy selecting every node:
//
//  1. the nodes, registered after the policy, are inflated from their registration;
//  2. over quietWindow every stored version of the nodes and their Leases is recorded (a watch
//     from a List's resourceVersion): per node 1 or 2 stored writes that only renew heartbeats,
//     while the kubelet sent ~33 PATCHes; the Leases renew every ~10 s; Ready never leaves True;
//     the stored Ready heartbeat is never older than the refresh period plus two kubelet periods
//     (plus slack);
//  3. a scripted MemoryPressure=True (fakenode.ConditionsAnnotation), and back, is stored at
//     the kubelet's next sync, with a fresh heartbeat;
//  4. a policy change (cpu ratio 2 -> 3) is stored at each node's next sync;
//  5. the replicas restarted with --heartbeat-refresh=0 (off): each node writes every ~10 s
//     again, which is what the feature saved.
//
// About 7.5 minutes: phase 2 must outlast the 5-minute refresh. `go test -short` skips it.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

const (
	quietPrefix = "qh"
	quietNodes  = 3
	quietPolicy = "quiet-all"
	// quietKubeletPeriod is the fake kubelets' --status-update-frequency (the kubelet default).
	quietKubeletPeriod = 10 * time.Second
	// quietRefresh is the replicas' --heartbeat-refresh until phase 5: the kubelet's default
	// nodeStatusReportFrequency, the value the README recommends.
	quietRefresh = 5 * time.Minute
	// quietWindow is longer than the refresh period plus one kubelet period plus slack, so each
	// node's heartbeat refresh must be stored inside it (at least one write: the heartbeat is
	// kept fresh, not frozen), and shorter than two refresh periods, so that at most 2 fit (one
	// right at the start, the next 5m10s later). Without the feature a node writes every 10 s:
	// 33 times in it.
	quietWindow    = 5*time.Minute + 30*time.Second
	quietMaxWrites = 2
	// quietMinPatches: the kubelets kept PATCHing every 10 s through the window (33 expected),
	// so the quiet is the storage skipping them, not the kubelet not sending.
	quietMinPatches = 25
	// quietMinRenewals of a node's Lease in the window (renewed every 10 s: 33 expected).
	quietMinRenewals = 20
	// quietMaxHeartbeatAge: a stored heartbeat that reached the refresh age is replaced at the
	// kubelet's next PATCH (one period); one more period and 15 s for a slow or retried write.
	quietMaxHeartbeatAge = quietRefresh + 2*quietKubeletPeriod + 15*time.Second
	// quietChangeTimeout: a real change is stored at the kubelet's next sync, one period away.
	quietChangeTimeout = 25 * time.Second
	// quietOffWindow and quietOffMinWrites: with the feature off, writes every 10 s (6 in 60 s).
	quietOffWindow    = 60 * time.Second
	quietOffMinWrites = 4
	// quietOffMaxHeartbeatAge: a period, a second of heartbeat rounding and slack for a slow
	// write.
	quietOffMaxHeartbeatAge = quietKubeletPeriod + 10*time.Second
	// quietPoll: how often the windows read the nodes (Ready, stored heartbeat age).
	quietPoll = 5 * time.Second
)

func TestQuietHeartbeats(t *testing.T) {
	longestOwnControlPlane(t)
	if testing.Short() {
		t.Skip("takes 7.5 minutes: its window must outlast the 5-minute heartbeat refresh")
	}
	start := time.Now()
	c := harness.Start(t, harness.Options{})
	if c.External {
		t.Skip("needs its own control plane: it counts every write of its nodes and installs a webhook for every node")
	}
	ctx := harness.Context(t, 15*time.Minute)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}

	in := installReplicas(t, ctx, c, append(slices.Clone(ocServeArgs), "--heartbeat-refresh="+quietRefresh.String())...)
	policies := dyn.Resource(ocPolicies)
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1",
		"kind":       "OvercommitPolicy",
		"metadata":   map[string]any{"name": quietPolicy},
		"spec":       map[string]any{"nodeRatios": map[string]any{"cpu": "2"}}, // no selector: every node
	}}
	if _, err := policies.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := waitPoliciesLoaded(in, 1); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed: %s; policy %s (cpu x2, every node) loaded (%.1fs)", in.Summary(), quietPolicy, time.Since(start).Seconds())

	// Every stored version of the nodes and their Leases from here on.
	nodeHistory := watchNodes(t, ctx, cs)
	leaseHistory := watchHistory(t, ctx, func(ctx context.Context) ([]*coordinationv1.Lease, string, error) {
		l, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", err
		}
		return pointers(l.Items), l.ResourceVersion, nil
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Watch(ctx, o)
	})

	// 1. The kubelets register after the policy is loaded, so the webhook inflates the
	// registration itself (a node registered earlier would first write again at its 5-minute
	// report).
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: quietPrefix, Count: quietNodes, Args: []string{
		fmt.Sprintf("--cpu=%d", ocNodeCPU), "--memory=16Gi", "--images=50",
		"--status-update-frequency=" + quietKubeletPeriod.String(), "--status-report-frequency=5m",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	raw, ratio2, ratio3 := fmt.Sprint(ocNodeCPU), fmt.Sprint(ocNodeCPU*2), fmt.Sprint(ocNodeCPU*3)
	// Settled: inflated, Ready, and the not-ready taint of the registration removed by the node
	// lifecycle controller, so that the window starts on nodes nothing else is about to write.
	for _, n := range nodes.Names {
		if err := waitNode(ctx, cs, n, 90*time.Second, nodeReady, cpuIs(ratio2), rawAnnotation(raw), appliedPolicy(quietPolicy), untainted); err != nil {
			t.Fatal(err)
		}
	}
	// ... and each kubelet's first status PATCH stored: it adds the kubelet's managedFields entry
	// for the status subresource, a write even when the status is kept as stored.
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		st, err := nodes.Stats()
		if err != nil {
			return err
		}
		for _, n := range nodes.Names {
			if patchesSent(st, n) < 1 {
				return fmt.Errorf("%s: no status PATCH yet", n)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("nodes %v registered inflated (cpu %s -> %s), Ready, untainted, first status PATCH sent (%.1fs)", nodes.Names, raw, ratio2, time.Since(start).Seconds())

	var summary []string

	// 2. Quiet: the window.
	t.Run("quiet for the window", func(t *testing.T) {
		before, err := nodes.Stats()
		if err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		maxAge, notReady := observeNodes(t, ctx, cs, nodes.Names, quietWindow, 0, func(elapsed time.Duration) {
			var parts []string
			for _, n := range nodes.Names {
				ws := nodeWrites(nodeHistory, n, from, time.Now())
				parts = append(parts, fmt.Sprintf("%s %d", n, len(ws)))
			}
			t.Logf("window %v of %v: stored writes so far: %s", elapsed.Round(time.Second), quietWindow, strings.Join(parts, ", "))
		})
		to := time.Now()
		after, err := nodes.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range notReady {
			t.Errorf("node not Ready in the window: %s", p)
		}
		if maxAge > quietMaxHeartbeatAge {
			t.Errorf("a stored Ready heartbeat was %v old, more than %v", maxAge.Round(time.Second), quietMaxHeartbeatAge)
		}
		var writes, patches, renewals []string
		for _, n := range nodes.Names {
			ws := nodeWrites(nodeHistory, n, from, to)
			heartbeats := 0
			for _, w := range ws {
				switch w.kind {
				case heartbeatWrite:
					heartbeats++
				case statusChange:
					t.Logf("%s: a real status change in the window at %s (rv %s): %s", n, w.at.Format(time.TimeOnly), w.rv, w.what)
				default:
					t.Logf("%s: a metadata/spec change in the window at %s (rv %s): %s", n, w.at.Format(time.TimeOnly), w.rv, w.what)
				}
				if w.node != nil {
					if err := cpuIs(ratio2)(w.node); err != nil {
						t.Errorf("%s rv %s stored at %s: %v (a write the webhook did not inflate)", n, w.rv, w.at.Format(time.TimeOnly), err)
					}
				}
			}
			if heartbeats > quietMaxWrites || heartbeats < 1 {
				t.Errorf("%s: %d stored writes that only renew heartbeats in %v, want 1 to %d (%s)", n, heartbeats, quietWindow, quietMaxWrites, describeWrites(ws))
			}
			// The watch saw every version: the node's resourceVersion now is the last one seen
			// (once an event in flight has arrived).
			if err := harness.Eventually(5*time.Second, 100*time.Millisecond, func() error {
				cur, err := cs.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if last := nodeHistory.last(n); last == nil || last.GetResourceVersion() != cur.ResourceVersion {
					return fmt.Errorf("stored resourceVersion %s is not the last one the watch saw", cur.ResourceVersion)
				}
				return nil
			}); err != nil {
				t.Errorf("%s: %v", n, err)
			}
			sent := patchesSent(after, n) - patchesSent(before, n)
			if sent < quietMinPatches {
				t.Errorf("%s: the kubelet sent only %d status PATCHes in the window, want at least %d", n, sent, quietMinPatches)
			}
			renewed, gap := leaseRenewals(leaseHistory, n, from, to)
			if renewed < quietMinRenewals {
				t.Errorf("Lease %s renewed %d times in the window, want at least %d", n, renewed, quietMinRenewals)
			}
			writes = append(writes, fmt.Sprintf("%s %d (%d heartbeat-only)", n, len(ws), heartbeats))
			patches = append(patches, fmt.Sprintf("%s %d", n, sent))
			renewals = append(renewals, fmt.Sprintf("%s %d (longest gap %v)", n, renewed, gap.Round(100*time.Millisecond)))
		}
		kept, err := sumMetric(in, "kube_overcommit_heartbeats_kept_total")
		if err != nil {
			t.Logf("heartbeats kept metric: %v", err)
		}
		line := fmt.Sprintf("heartbeat refresh %v, window %v: stored writes per node: %s; kubelet PATCHes per node: %s; Lease renewals: %s; oldest stored Ready heartbeat seen %v (bound %v); reviews with heartbeats kept (replicas' metric) %v",
			quietRefresh, quietWindow, strings.Join(writes, ", "), strings.Join(patches, ", "), strings.Join(renewals, ", "),
			maxAge.Round(time.Second), quietMaxHeartbeatAge, kept)
		t.Log(line)
		summary = append(summary, line)
	})

	// 3. A real condition change is stored at the kubelet's next sync, and so is its end.
	t.Run("condition change", func(t *testing.T) {
		name := nodes.Names[0]
		for _, tc := range []struct {
			script string // the annotation's value; "" removes it
			status corev1.ConditionStatus
		}{{`{"MemoryPressure":"True"}`, corev1.ConditionTrue}, {"", corev1.ConditionFalse}} {
			old, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			was := nodeCondition(old, corev1.NodeMemoryPressure)
			value := "null"
			if tc.script != "" {
				value = fmt.Sprintf("%q", tc.script)
			}
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, fakenode.ConditionsAnnotation, value)
			since := time.Now()
			if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			at, stored, err := waitStored(nodeHistory, name, since, quietChangeTimeout, func(n *corev1.Node) error {
				if c := nodeCondition(n, corev1.NodeMemoryPressure); c.Status != tc.status {
					return fmt.Errorf("MemoryPressure %s, want %s", c.Status, tc.status)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s: MemoryPressure=%s not stored within %v of scripting it: %v", name, tc.status, quietChangeTimeout, err)
			}
			now := nodeCondition(stored, corev1.NodeMemoryPressure)
			if !now.LastHeartbeatTime.After(was.LastHeartbeatTime.Time) || !now.LastTransitionTime.After(was.LastTransitionTime.Time) {
				t.Errorf("%s: MemoryPressure %s stored with heartbeat %v, transition %v; before: heartbeat %v, transition %v (want both newer)",
					name, tc.status, now.LastHeartbeatTime, now.LastTransitionTime, was.LastHeartbeatTime, was.LastTransitionTime)
			}
			if err := cpuIs(ratio2)(stored); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			line := fmt.Sprintf("%s: MemoryPressure %s -> %s stored %.1fs after scripting it (heartbeat %s, was %s)",
				name, was.Status, tc.status, at.Sub(since).Seconds(), now.LastHeartbeatTime.Format(time.TimeOnly), was.LastHeartbeatTime.Format(time.TimeOnly))
			t.Log(line)
			summary = append(summary, line)
		}
	})

	// 4. A policy change is stored at each node's next sync.
	t.Run("policy change", func(t *testing.T) {
		since := time.Now()
		if _, err := policies.Patch(ctx, quietPolicy, types.MergePatchType, []byte(`{"spec":{"nodeRatios":{"cpu":"3"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		var lat []string
		for _, n := range nodes.Names {
			at, _, err := waitStored(nodeHistory, n, since, quietChangeTimeout, func(n *corev1.Node) error {
				if err := cpuIs(ratio3)(n); err != nil {
					return err
				}
				return rawAnnotation(raw)(n)
			})
			if err != nil {
				t.Errorf("%s: cpu ratio 3 not stored within %v: %v", n, quietChangeTimeout, err)
				continue
			}
			lat = append(lat, fmt.Sprintf("%s %.1fs", n, at.Sub(since).Seconds()))
		}
		line := fmt.Sprintf("policy cpu ratio 2 -> 3: allocatable cpu %s stored after %s", ratio3, strings.Join(lat, ", "))
		t.Log(line)
		summary = append(summary, line)
	})

	// 5. Off: the same replicas restarted with --heartbeat-refresh=0. Every PATCH renews the
	// heartbeats, so each node writes every 10 s again.
	t.Run("refresh 0 writes every period", func(t *testing.T) {
		in.Args = append(slices.Clone(ocServeArgs), "--heartbeat-refresh=0")
		for _, r := range in.Replicas() {
			if err := r.Restart(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := in.WaitReady(len(in.Replicas()), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		if err := waitPoliciesLoaded(in, 1); err != nil {
			t.Fatal(err)
		}
		from := time.Now()
		// The first PATCH of each kubelet after the restarts comes within one period; from then
		// on the stored heartbeat is never older than a period and a write.
		maxAge, notReady := observeNodes(t, ctx, cs, nodes.Names, quietOffWindow, quietKubeletPeriod+quietPoll, nil)
		to := time.Now()
		for _, p := range notReady {
			t.Errorf("node not Ready: %s", p)
		}
		if maxAge > quietOffMaxHeartbeatAge {
			t.Errorf("a stored Ready heartbeat was %v old with --heartbeat-refresh=0, more than %v", maxAge.Round(time.Second), quietOffMaxHeartbeatAge)
		}
		var writes []string
		for _, n := range nodes.Names {
			ws := nodeWrites(nodeHistory, n, from, to)
			heartbeats := 0
			for _, w := range ws {
				if w.kind == heartbeatWrite {
					heartbeats++
				}
			}
			if heartbeats < quietOffMinWrites {
				t.Errorf("%s: %d heartbeat writes in %v with --heartbeat-refresh=0, want at least %d (%s)", n, heartbeats, quietOffWindow, quietOffMinWrites, describeWrites(ws))
			}
			writes = append(writes, fmt.Sprintf("%s %d", n, heartbeats))
		}
		line := fmt.Sprintf("heartbeat refresh 0: heartbeat writes per node in %v: %s; oldest stored Ready heartbeat seen %v (bound %v)",
			quietOffWindow, strings.Join(writes, ", "), maxAge.Round(time.Second), quietOffMaxHeartbeatAge)
		t.Log(line)
		summary = append(summary, line)
	})

	// Throughout: no kubelet write failed, and Ready never left True in any stored version.
	st, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if w := st.StatusWrites; w.Failures != 0 || st.Registrations.Failures != 0 || st.LeaseFailures != 0 {
		t.Errorf("failures: status writes %d (last %q), registrations %d, lease renewals %d", w.Failures, w.LastError, st.Registrations.Failures, st.LeaseFailures)
	}
	for _, n := range nodes.Names {
		for _, v := range nodeHistory.of(n) {
			if c := nodeCondition(v.obj, corev1.NodeReady); c.Status != corev1.ConditionTrue {
				t.Errorf("%s rv %s stored Ready=%s (%s) at %s", n, v.obj.ResourceVersion, c.Status, c.Reason, v.at.Format(time.TimeOnly))
			}
		}
	}
	t.Logf("TestQuietHeartbeats summary (%.0fs):\n  %s", time.Since(start).Seconds(), strings.Join(summary, "\n  "))
}

func untainted(n *corev1.Node) error {
	if len(n.Spec.Taints) != 0 {
		return fmt.Errorf("taints %v", n.Spec.Taints)
	}
	return nil
}

func nodeCondition(n *corev1.Node, kind corev1.NodeConditionType) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == kind {
			return c
		}
	}
	return corev1.NodeCondition{Type: kind}
}

// observeNodes reads the nodes every quietPoll for d: the oldest stored Ready heartbeat it saw
// after the first `settle` of d, and every time a node was not Ready. progress, if set, is
// called about once a minute.
func observeNodes(t *testing.T, ctx context.Context, cs kubernetes.Interface, names []string, d, settle time.Duration, progress func(elapsed time.Duration)) (time.Duration, []string) {
	t.Helper()
	var maxAge time.Duration
	var notReady []string
	start := time.Now()
	lastProgress := start
	tick := time.NewTicker(quietPoll)
	defer tick.Stop()
	for time.Since(start) < d {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
		for _, name := range names {
			n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				notReady = append(notReady, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			c := nodeCondition(n, corev1.NodeReady)
			if c.Status != corev1.ConditionTrue {
				notReady = append(notReady, fmt.Sprintf("%s Ready=%s (%s) at %s", name, c.Status, c.Reason, time.Now().Format(time.TimeOnly)))
			}
			if age := time.Since(c.LastHeartbeatTime.Time); age > maxAge && time.Since(start) >= settle {
				maxAge = age
			}
		}
		if progress != nil && time.Since(lastProgress) >= time.Minute {
			lastProgress = time.Now()
			progress(time.Since(start))
		}
	}
	return maxAge, notReady
}

// version is one stored version of an object, as the watch delivered it.
type version[T metav1.Object] struct {
	at  time.Time
	obj T
}

// history is every version of the objects one watch sees, by name, in order: the List's items,
// then every ADDED and MODIFIED event from its resourceVersion on. A RetryWatcher resumes a
// closed watch from the last resourceVersion, so no version is missed.
type history[T metav1.Object] struct {
	mu       sync.Mutex
	versions map[string][]version[T]
}

func watchHistory[T metav1.Object](t *testing.T, ctx context.Context, list func(context.Context) ([]T, string, error), watchFunc cache.WatchFuncWithContext) *history[T] {
	t.Helper()
	items, rv, err := list(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &history[T]{versions: map[string][]version[T]{}}
	for _, it := range items {
		h.add(it)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{WatchFuncWithContext: watchFunc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if obj, ok := ev.Object.(T); ok {
				h.add(obj)
			}
		}
	}()
	return h
}

func (h *history[T]) add(obj T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.versions[obj.GetName()] = append(h.versions[obj.GetName()], version[T]{at: time.Now(), obj: obj})
}

func (h *history[T]) of(name string) []version[T] {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions[name])
}

func (h *history[T]) last(name string) metav1.Object {
	vs := h.of(name)
	if len(vs) == 0 {
		return nil
	}
	return vs[len(vs)-1].obj
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// waitStored waits up to timeout for the first version of node name seen after since that
// passes check, and returns when the watch delivered it.
func waitStored(h *history[*corev1.Node], name string, since time.Time, timeout time.Duration, check nodeCheck) (time.Time, *corev1.Node, error) {
	var at time.Time
	var found *corev1.Node
	err := harness.Eventually(timeout, 200*time.Millisecond, func() error {
		last := fmt.Errorf("no version of %s stored since %s", name, since.Format(time.TimeOnly))
		for _, v := range h.of(name) {
			if !v.at.After(since) {
				continue
			}
			if err := check(v.obj); err != nil {
				last = fmt.Errorf("rv %s: %w", v.obj.ResourceVersion, err)
				continue
			}
			at, found = v.at, v.obj
			return nil
		}
		return last
	})
	return at, found, err
}

type writeKind int

const (
	heartbeatWrite writeKind = iota // the status differs only in condition heartbeat times
	statusChange                    // a real status change
	otherChange                     // same status: metadata or spec
)

// nodeWrite is one stored version of a node, compared with the version before it.
type nodeWrite struct {
	at   time.Time
	rv   string
	kind writeKind
	what string
	node *corev1.Node
}

// nodeWrites classifies the versions of node name the watch delivered in (from, to].
func nodeWrites(h *history[*corev1.Node], name string, from, to time.Time) []nodeWrite {
	var out []nodeWrite
	vs := h.of(name)
	for i := 1; i < len(vs); i++ {
		if !vs[i].at.After(from) || vs[i].at.After(to) {
			continue
		}
		old, cur := vs[i-1].obj, vs[i].obj
		w := nodeWrite{at: vs[i].at, rv: cur.ResourceVersion, node: cur}
		switch {
		case fakenode.StatusChanged(&old.Status, &cur.Status):
			w.kind, w.what = statusChange, statusDiff(old, cur)
		case !apiequality.Semantic.DeepEqual(old.Status, cur.Status):
			w.kind, w.what = heartbeatWrite, "heartbeats"
		default:
			w.kind, w.what = otherChange, metadataDiff(old, cur)
		}
		out = append(out, w)
	}
	return out
}

func statusDiff(old, cur *corev1.Node) string {
	var parts []string
	for name, q := range cur.Status.Allocatable {
		if o, ok := old.Status.Allocatable[name]; !ok || o.Cmp(q) != 0 {
			parts = append(parts, fmt.Sprintf("allocatable %s %s -> %s", name, o.String(), q.String()))
		}
	}
	for _, c := range cur.Status.Conditions {
		o := nodeCondition(old, c.Type)
		if o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message || !o.LastTransitionTime.Equal(&c.LastTransitionTime) {
			parts = append(parts, fmt.Sprintf("%s %s -> %s (%s)", c.Type, o.Status, c.Status, c.Reason))
		}
	}
	if len(parts) == 0 {
		return "other status fields"
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func metadataDiff(old, cur *corev1.Node) string {
	var parts []string
	if !apiequality.Semantic.DeepEqual(old.Spec, cur.Spec) {
		parts = append(parts, fmt.Sprintf("spec (taints %v -> %v)", old.Spec.Taints, cur.Spec.Taints))
	}
	if !apiequality.Semantic.DeepEqual(old.Labels, cur.Labels) {
		parts = append(parts, "labels")
	}
	if !apiequality.Semantic.DeepEqual(old.Annotations, cur.Annotations) {
		parts = append(parts, "annotations")
	}
	if !apiequality.Semantic.DeepEqual(old.ManagedFields, cur.ManagedFields) {
		parts = append(parts, "managedFields")
	}
	if len(parts) == 0 {
		return "other metadata"
	}
	return strings.Join(parts, "; ")
}

func describeWrites(ws []nodeWrite) string {
	if len(ws) == 0 {
		return "none"
	}
	var parts []string
	for _, w := range ws {
		parts = append(parts, fmt.Sprintf("%s rv %s %s", w.at.Format(time.TimeOnly), w.rv, w.what))
	}
	return strings.Join(parts, ", ")
}

// leaseRenewals counts the versions of Lease name delivered in (from, to] whose renewTime
// moved forward, and the longest time between consecutive renewTimes among them.
func leaseRenewals(h *history[*coordinationv1.Lease], name string, from, to time.Time) (int, time.Duration) {
	n := 0
	var gap time.Duration
	var prev time.Time
	for _, v := range h.of(name) {
		rt := v.obj.Spec.RenewTime
		if rt == nil || !rt.After(prev) {
			continue
		}
		if v.at.After(from) && !v.at.After(to) {
			n++
			if !prev.IsZero() && rt.Sub(prev) > gap {
				gap = rt.Sub(prev)
			}
		}
		prev = rt.Time
	}
	return n, gap
}

// patchesSent is how many status PATCHes a fake kubelet has sent (stored or not).
func patchesSent(st harness.FakeNodeStats, node string) int64 {
	if ns := st.PerNode[node]; ns != nil {
		return ns.StatusWrites
	}
	return 0
}

// sumMetric is the sum over the replicas of every series of a metric.
func sumMetric(in *install.Installation, name string) (float64, error) {
	var sum float64
	for _, r := range in.Replicas() {
		m, err := replicaMetrics(r)
		if err != nil {
			return sum, err
		}
		for k, v := range m {
			if k == name || strings.HasPrefix(k, name+"{") {
				sum += v
			}
		}
	}
	return sum, nil
}

package e2e

// Issue 34 on the real control plane, on hollow kubelets (Kubernetes' own kubelet code):
// a staged rollout (spec.rollout, docs/policy.md "Staged rollout").
//
// TestRolloutStepsHollowNodes: ten hollow nodes of 4 cpu, two replicas as the ServiceAccount
// (its RBAC, the node guard). A policy without rollout reaches every node at once (cpu x2,
// within 30 s). Then one edit raises the ratio to 3 with maxNodesPerStep 2 and a 10 s interval:
// sampled every 300 ms from the stored nodes (allocatable cpu, the applied annotation's
// generation) and the policy's status.rollout, the nodes move 2 per step: at no sample are more
// nodes at cpu 12 than twice the steps the status shows, consecutive steps are at least 10 s
// apart (status.rollout.lastStepTime), and never more than 4 nodes move within 10 s. The leader
// is SIGKILLed after the second step: the next leader continues from the status (no step lost:
// the step number goes on from where it was; none doubled: the pace holds across the kill).
// `paused: true` holds it (once the admitted nodes moved, no node moves for 25 s), unpausing
// resumes it to all ten. While paused, the scheduler binds 9-cpu pods only to moved nodes
// (one each), the next one stays Unschedulable. A lowered ratio (1.5) then reaches every node within 30 s, unpaced.
// The timeline is logged.
// Then a second edit mid-rollout (checkSecondEdit): with one node relabelled out of the pool
// (raw at once), cpu 2 (8) with 3 nodes per 5 s step; after the first step, cpu 2.5 (10), and
// the node relabelled back in. No node moves off 6 but by a step (the last rollout's admitted
// list does not carry over to a new generation); the nodes that moved to 8 stay there until a
// step admits them again, the others stay at 6, the joiner stays raw (4) until a step admits it;
// at most 3 admitted at any sample, steps at least 5 s apart, and never more nodes at 10 than
// the steps since the second edit allow (plus those admitted and not yet moved when it came).

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/annotations"
	"kube-overcommit/tests/cluster/internal/fakenode"
)

const (
	rolloutPolicy   = "staged"
	rolloutNodes    = 10
	rolloutStep     = 2
	rolloutInterval = 10 * time.Second
)

// rolloutSample is what one look at the cluster saw.
type rolloutSample struct {
	at       time.Time
	cpu      map[string]string // node -> stored allocatable cpu
	gen      map[string]int64  // node -> generation in its applied annotation
	step     int64
	last     string // status.rollout.lastStepTime
	paused   bool
	admitted []string
	waiting  int64
}

func (s rolloutSample) count(cpu string) int {
	n := 0
	for _, c := range s.cpu {
		if c == cpu {
			n++
		}
	}
	return n
}

func TestRolloutStepsHollowNodes(t *testing.T) {
	ownControlPlane(t)
	start := time.Now()
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 12*time.Minute)
	cs := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	in := installAsServiceAccount(t, ctx, c, nil)
	names := startQuietHollow(t, ctx, c, "staged", rolloutNodes, "rollout=pool")
	sort.Strings(names)
	t.Logf("%d hollow kubelets Ready (%.1fs)", len(names), time.Since(start).Seconds())

	policies := dyn.Resource(ocPolicies)
	edit := func(change func(spec map[string]any)) {
		t.Helper()
		editPolicy(t, ctx, policies, rolloutPolicy, change)
	}
	allAt := func(cpu string, within time.Duration) {
		t.Helper()
		from := time.Now()
		for _, n := range names {
			if err := waitNode(ctx, cs, n, within-time.Since(from), cpuIs(cpu), appliedPolicy(rolloutPolicy)); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("every node at cpu %s %.1fs after the change", cpu, time.Since(from).Seconds())
	}

	// 1. Without rollout: every node at once.
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1", "kind": "OvercommitPolicy",
		"metadata": map[string]any{"name": rolloutPolicy},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"rollout": "pool"}},
			"nodeRatios":   map[string]any{"cpu": "2"},
		},
	}}
	if _, err := policies.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	allAt("8", nudgeDeadline)

	// 2. The staged raise, sampled throughout.
	sample := func() (rolloutSample, error) {
		s := rolloutSample{at: time.Now(), gen: map[string]int64{}}
		cpu, applied, err := poolNodes(ctx, cs, "rollout=pool")
		if err != nil {
			return s, err
		}
		s.cpu = cpu
		for n, a := range applied {
			s.gen[n] = a.Generation
		}
		p, err := policies.Get(ctx, rolloutPolicy, metav1.GetOptions{})
		if err != nil {
			return s, err
		}
		s.step, _, _ = unstructured.NestedInt64(p.Object, "status", "rollout", "step")
		s.last, _, _ = unstructured.NestedString(p.Object, "status", "rollout", "lastStepTime")
		s.paused, _, _ = unstructured.NestedBool(p.Object, "status", "rollout", "paused")
		s.admitted, _, _ = unstructured.NestedStringSlice(p.Object, "status", "rollout", "admitted")
		s.waiting, _, _ = unstructured.NestedInt64(p.Object, "status", "rollout", "nodesWaiting")
		return s, nil
	}
	var samples []rolloutSample
	// until samples until done says stop, failing the test after timeout.
	until := func(what string, timeout time.Duration, done func(rolloutSample) bool) rolloutSample {
		t.Helper()
		return sampleUntil(t, sample, &samples, what, timeout, done)
	}
	edited := time.Now()
	edit(func(spec map[string]any) {
		spec["nodeRatios"] = map[string]any{"cpu": "3"}
		spec["rollout"] = map[string]any{"maxNodesPerStep": int64(rolloutStep), "stepInterval": "10s"}
	})
	moved := func(n int) func(rolloutSample) bool {
		return func(s rolloutSample) bool { return s.count("12") >= n }
	}
	until("two steps", 90*time.Second, moved(2*rolloutStep))

	// 3. The leader killed mid-rollout.
	leader := in.Leader(ctx)
	if leader == nil {
		t.Fatal("no leader")
	}
	before, _ := sample()
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("leader %s killed at %d nodes moved, step %d", leader.Identity(), before.count("12"), before.step)
	after := until("a step by the next leader", 90*time.Second, func(s rolloutSample) bool { return s.step > before.step })
	if after.step != before.step+1 {
		t.Errorf("after the kill the step went from %d to %d: a step lost or doubled", before.step, after.step)
	}
	t.Logf("the next leader took step %d %.1fs after the kill", after.step, time.Since(killed).Seconds())
	until("six nodes moved", 90*time.Second, moved(6))

	// 4. Paused: once the admitted nodes moved, nothing moves.
	edit(func(spec map[string]any) {
		r, _ := spec["rollout"].(map[string]any)
		r["paused"] = true
	})
	held := until("paused, admitted nodes moved", 60*time.Second, func(s rolloutSample) bool {
		return s.paused && len(s.admitted) == 0
	})
	pausedAt := held.count("12")
	holdUntil := time.Now().Add(25 * time.Second)
	until("the pause held 25 s", 40*time.Second, func(s rolloutSample) bool {
		if s.count("12") != pausedAt {
			t.Fatalf("paused at %d nodes moved, %d at %s", pausedAt, s.count("12"), s.at.Format(time.RFC3339))
		}
		return time.Now().After(holdUntil)
	})
	t.Logf("paused: %d nodes at cpu 12 for 25 s (step %d, %d waiting)", pausedAt, held.step, held.waiting)
	checkScheduler(t, ctx, cs, held, pausedAt)

	// 5. Unpaused: it resumes, to every node.
	edit(func(spec map[string]any) {
		r, _ := spec["rollout"].(map[string]any)
		r["paused"] = false
	})
	until("all ten moved", 120*time.Second, moved(rolloutNodes))
	allAt("12", 10*time.Second)
	checkPace(t, samples, edited)
	checkStepEvents(t, ctx, cs)

	// 6. A lowered ratio is not paced.
	edit(func(spec map[string]any) { spec["nodeRatios"] = map[string]any{"cpu": "1.5"} })
	allAt("6", nudgeDeadline)

	// 7. A second raising edit mid-rollout, and a node joining the pool mid-rollout.
	checkSecondEdit(t, ctx, cs, edit, sample, names)
	t.Logf("TestRolloutStepsHollowNodes done in %.1fs", time.Since(start).Seconds())
}

// sampleUntil samples every 300 ms, appending to *samples, until done says stop; it fails the
// test after timeout.
func sampleUntil(t *testing.T, sample func() (rolloutSample, error), samples *[]rolloutSample, what string,
	timeout time.Duration, done func(rolloutSample) bool) rolloutSample {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(300 * time.Millisecond) {
		s, err := sample()
		if err == nil {
			*samples = append(*samples, s)
			if done(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last sample: cpu %v, step %d, admitted %v, paused %v; err %v)",
				what, timeout, s.cpu, s.step, s.admitted, s.paused, err)
		}
	}
}

// checkPace checks the samples against the rollout's bounds and logs the timeline.
func checkPace(t *testing.T, samples []rolloutSample, edited time.Time) {
	t.Helper()
	var lines []string
	var steps []time.Time
	seen := map[string]bool{}
	for i, s := range samples {
		if s.count("12") > rolloutStep*int(s.step) {
			t.Errorf("at %.1fs: %d nodes at cpu 12 after %d steps of %d", s.at.Sub(edited).Seconds(), s.count("12"), s.step, rolloutStep)
		}
		// Never more than two steps' worth within one interval.
		for j := i - 1; j >= 0 && s.at.Sub(samples[j].at) < rolloutInterval; j-- {
			if d := s.count("12") - samples[j].count("12"); d > 2*rolloutStep {
				t.Errorf("%d nodes moved between %.1fs and %.1fs", d, samples[j].at.Sub(edited).Seconds(), s.at.Sub(edited).Seconds())
			}
		}
		if s.last != "" && !seen[s.last] {
			seen[s.last] = true
			if at, err := time.Parse(time.RFC3339, s.last); err == nil {
				steps = append(steps, at)
			}
		}
		if i == 0 || s.count("12") != samples[i-1].count("12") || s.step != samples[i-1].step || s.paused != samples[i-1].paused {
			var at12 []string
			for n, c := range s.cpu {
				if c == "12" {
					at12 = append(at12, fmt.Sprintf("%s(gen %d)", strings.TrimPrefix(n, "staged-"), s.gen[n]))
				}
			}
			sort.Strings(at12)
			lines = append(lines, fmt.Sprintf("  %6.1fs step %d paused=%v admitted=%v waiting=%d at cpu 12: %d %v",
				s.at.Sub(edited).Seconds(), s.step, s.paused, s.admitted, s.waiting, len(at12), at12))
		}
	}
	for i := 1; i < len(steps); i++ {
		if gap := steps[i].Sub(steps[i-1]); gap < rolloutInterval {
			t.Errorf("steps at %s and %s: %s apart, under the %s interval", steps[i-1], steps[i], gap, rolloutInterval)
		}
	}
	t.Logf("timeline from the edit (stored allocatable and applied generation, status.rollout):\n%s", strings.Join(lines, "\n"))
}

// checkScheduler: while the rollout is paused with `moved` nodes at cpu 12 and the others at 8,
// moved+1 pods of 9 cpu for the pool: the scheduler binds one to each moved node and leaves the
// last Unschedulable (a waiting node's 8 cpu is too small): the new room is used only on moved
// nodes.
func checkScheduler(t *testing.T, ctx context.Context, cs kubernetes.Interface, s rolloutSample, moved int) {
	t.Helper()
	ns := "rollout-pods"
	ocNamespace(t, ctx, cs, ns, nil)
	for i := 0; i <= moved; i++ {
		pod := hollowPod(ns, fmt.Sprintf("big-%d", i), "", "9")
		pod.Spec.NodeSelector = map[string]string{"rollout": "pool"}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err := harness.Eventually(60*time.Second, 500*time.Millisecond, func() error {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		bound, unschedulable := map[string]bool{}, 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				if s.cpu[p.Spec.NodeName] != "12" {
					t.Fatalf("pod %s bound to %s, a node at cpu %s", p.Name, p.Spec.NodeName, s.cpu[p.Spec.NodeName])
				}
				bound[p.Spec.NodeName] = true
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					unschedulable++
				}
			}
		}
		if len(bound) != moved || unschedulable != 1 {
			return fmt.Errorf("%d moved nodes took a 9-cpu pod (want %d), %d pods Unschedulable (want 1)", len(bound), moved, unschedulable)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scheduler: %d pods of 9 cpu bound, one to each moved node; the last Unschedulable (waiting nodes show 8)", moved)
}

// checkStepEvents: one Event per step on the policy (reason RolloutStep, events.k8s.io/v1 in
// default, where cluster-scoped objects' Events go), each naming the nodes it admitted.
func checkStepEvents(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	err := harness.Eventually(30*time.Second, 500*time.Millisecond, func() error {
		list, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var notes []string
		for _, e := range list.Items {
			if e.Regarding.Name == rolloutPolicy && e.Reason == "RolloutStep" {
				notes = append(notes, e.Note)
			}
		}
		sort.Strings(notes)
		if len(notes) < 5 {
			return fmt.Errorf("%d RolloutStep Events (want one per step, 5): %v", len(notes), notes)
		}
		t.Logf("RolloutStep Events on the policy:\n  %s", strings.Join(notes, "\n  "))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// poolNodes reads the nodes `selector` selects: each one's stored allocatable cpu and its
// applied annotation (where readable).
func poolNodes(ctx context.Context, cs kubernetes.Interface, selector string) (map[string]string, map[string]annotations.AppliedValue, error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, nil, err
	}
	cpu, applied := map[string]string{}, map[string]annotations.AppliedValue{}
	for _, n := range list.Items {
		q := n.Status.Allocatable[corev1.ResourceCPU]
		cpu[n.Name] = q.String()
		if a, err := annotations.ParseApplied(n.Annotations[ocAppliedAnnotation]); err == nil {
			applied[n.Name] = a
		}
	}
	return cpu, applied, nil
}

// editPolicy changes the spec of OvercommitPolicy `name` (retried on conflicts).
func editPolicy(t *testing.T, ctx context.Context, policies dynamic.NamespaceableResourceInterface, name string, change func(spec map[string]any)) {
	t.Helper()
	err := harness.Eventually(20*time.Second, 200*time.Millisecond, func() error {
		p, err := policies.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		spec, _, _ := unstructured.NestedMap(p.Object, "spec")
		change(spec)
		if err := unstructured.SetNestedMap(p.Object, spec, "spec"); err != nil {
			return err
		}
		_, err = policies.Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// usageStaged is the pool of TestUsage's staged-ceiling phase (checkUsageRollout).
const (
	usageStagedPolicy = "usage-staged"
	usageStagedNodes  = 3
)

// startUsageStaged starts the pool of checkUsageRollout in TestUsage: usageStagedNodes fake
// nodes of 4 cpu (label e2e-usage=staged), each running a pod that requests 3 cpu, node usage
// 200m. Started early so that metrics-server has their usage by the phase.
func startUsageStaged(t *testing.T, ctx context.Context, c *harness.Cluster, ns string) []string {
	t.Helper()
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "ustaged", Count: usageStagedNodes, Args: []string{
		"--resource-metrics", "--delete-on-exit", fmt.Sprintf("--cpu=%d", ocNodeCPU), "--memory=8Gi",
		"--labels=e2e-usage=staged", "--status-update-frequency=1s", "--status-report-frequency=3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	for _, n := range nodes.Names {
		if err := waitNode(ctx, c.Client, n, 60*time.Second, nodeReady); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "req-" + n, Namespace: ns,
			Annotations: map[string]string{fakenode.UsageAnnotation: `{"memory":"10Mi"}`}},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.invalid/app:1",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}},
			}}}}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, fakenode.UsageAnnotation, `{"cpu":"200m","memory":"1Gi"}`)
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(nodes.Names)
	return nodes.Names
}

// usageSample is one look at the staged usage pool: per node its stored allocatable cpu and the
// generation and cpu ceiling its applied annotation records; the policy's status.rollout.
type usageSample struct {
	at      time.Time
	cpu     map[string]string
	gen     map[string]int64
	ceiling map[string]string
	step    int64
	last    string
}

// checkUsageRollout (TestUsage, metrics-server serving): the ceiling of a usage policy changes
// by steps. Each node: raw cpu 4, 3 cpu requested, usage 200m; target 100% gives
// 3 + 4 - 0.2 = 6.8, clamped to the ceiling. At maxRatios cpu 1.25 every node is at 5 (no
// rollout yet: at once). maxRatios raised to 1.5 with rollout 1 node per step every 5 s: the
// nodes reach 6 one per step; sampled every 300 ms from the stored nodes, no node is ever
// above the ceiling its annotation records, a node at 6 carries the new generation and
// ceiling, a node not moved stays at 5 (the old ceiling), at most `step` nodes are at 6, steps
// are at least 5 s apart. The policy is deleted at the end.
func checkUsageRollout(t *testing.T, ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, names []string) {
	t.Helper()
	policies := dyn.Resource(ocPolicies)
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1", "kind": "OvercommitPolicy",
		"metadata": map[string]any{"name": usageStagedPolicy},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"e2e-usage": "staged"}},
			"usage": map[string]any{
				"targetUtilization": map[string]any{"cpu": "100%"},
				"maxRatios":         map[string]any{"cpu": "1.25"},
				"window":            "1m",
				"minChange":         "5%",
			},
		},
	}}
	if _, err := policies.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	for _, n := range names {
		if err := waitNode(ctx, cs, n, 60*time.Second, cpuIs("5"), appliedPolicy(usageStagedPolicy)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("usage ceiling 1.25: %d nodes at cpu 5 (3 requested + 4 x 100%% - 0.2 used, clamped to 4 x 1.25) %.1fs after the policy", len(names), time.Since(created).Seconds())

	sample := func() (usageSample, error) {
		s := usageSample{at: time.Now(), gen: map[string]int64{}, ceiling: map[string]string{}}
		cpu, applied, err := poolNodes(ctx, cs, "e2e-usage=staged")
		if err != nil {
			return s, err
		}
		s.cpu = cpu
		for n, a := range applied {
			s.gen[n], s.ceiling[n] = a.Generation, a.MaxRatios["cpu"]
		}
		p, err := policies.Get(ctx, usageStagedPolicy, metav1.GetOptions{})
		if err != nil {
			return s, err
		}
		s.step, _, _ = unstructured.NestedInt64(p.Object, "status", "rollout", "step")
		s.last, _, _ = unstructured.NestedString(p.Object, "status", "rollout", "lastStepTime")
		return s, nil
	}
	edited := time.Now()
	editPolicy(t, ctx, policies, usageStagedPolicy, func(spec map[string]any) {
		spec["usage"].(map[string]any)["maxRatios"] = map[string]any{"cpu": "1.5"}
		spec["rollout"] = map[string]any{"maxNodesPerStep": int64(1), "stepInterval": "5s"}
	})
	var lines []string
	var steps []time.Time
	seenStep := map[string]bool{}
	previous := ""
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		s, err := sample()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			continue
		}
		at6 := 0
		var row []string
		for _, n := range names {
			switch cpu, ceiling := s.cpu[n], s.ceiling[n]; {
			case cpu == "6" && ceiling == "1.5":
				at6++
			case cpu == "5" && ceiling == "1.25":
			default:
				t.Errorf("at %.1fs: %s at cpu %s carries ceiling %q (generation %d): want cpu 5 under 1.25 or 6 under 1.5",
					s.at.Sub(edited).Seconds(), n, cpu, ceiling, s.gen[n])
			}
			row = append(row, fmt.Sprintf("%s=%s(gen %d, max %s)", strings.TrimPrefix(n, "ustaged-"), s.cpu[n], s.gen[n], s.ceiling[n]))
		}
		if int64(at6) > s.step {
			t.Errorf("at %.1fs: %d nodes at the new ceiling after %d steps of 1", s.at.Sub(edited).Seconds(), at6, s.step)
		}
		if s.last != "" && !seenStep[s.last] {
			seenStep[s.last] = true
			if at, err := time.Parse(time.RFC3339, s.last); err == nil {
				steps = append(steps, at)
			}
		}
		if line := fmt.Sprintf("step %d: %s", s.step, strings.Join(row, " ")); line != previous {
			previous = line
			lines = append(lines, fmt.Sprintf("  %5.1fs %s", s.at.Sub(edited).Seconds(), line))
		}
		if at6 == len(names) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("usage ceiling by steps: not every node at cpu 6 within 60 s; timeline:\n%s", strings.Join(lines, "\n"))
		}
	}
	for i := 1; i < len(steps); i++ {
		if gap := steps[i].Sub(steps[i-1]); gap < 5*time.Second {
			t.Errorf("usage rollout steps at %s and %s: %s apart, under the 5s interval", steps[i-1], steps[i], gap)
		}
	}
	t.Logf("usage ceiling 1.25 -> 1.5 by steps of 1 every 5s: every node at cpu 6 %.1fs after the edit, %d steps; timeline (stored allocatable cpu, applied generation and ceiling):\n%s",
		time.Since(edited).Seconds(), len(steps), strings.Join(lines, "\n"))
	if err := policies.Delete(ctx, usageStagedPolicy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// checkSecondEdit: phase 7 of TestRolloutStepsHollowNodes (see its comment). `edit` changes
// the policy's spec, `sample` looks at the pool (nodes labelled rollout=pool) and the status.
func checkSecondEdit(t *testing.T, ctx context.Context, cs kubernetes.Interface, edit func(func(map[string]any)),
	sample func() (rolloutSample, error), names []string) {
	t.Helper()
	const step, interval = 3, 5 * time.Second
	joiner := names[len(names)-1]
	relabel := func(pool string) {
		t.Helper()
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"rollout":%q}}}`, pool)
		if _, err := cs.CoreV1().Nodes().Patch(ctx, joiner, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("out")
	if err := waitNode(ctx, cs, joiner, nudgeDeadline, cpuIs("4")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	edit(func(spec map[string]any) {
		spec["nodeRatios"] = map[string]any{"cpu": "2"}
		spec["rollout"] = map[string]any{"maxNodesPerStep": int64(step), "stepInterval": "5s"}
	})
	var samples []rolloutSample
	until := func(what string, timeout time.Duration, done func(rolloutSample) bool) rolloutSample {
		t.Helper()
		return sampleUntil(t, sample, &samples, what, timeout, done)
	}
	first := until("the first step to cpu 8", 30*time.Second, func(s rolloutSample) bool { return s.count("8") >= step })
	edit(func(spec map[string]any) { spec["nodeRatios"] = map[string]any{"cpu": "2.5"} })
	second := time.Now()
	relabel("pool")
	from := len(samples)
	all := until("every node at cpu 10", 90*time.Second, func(s rolloutSample) bool { return s.count("10") == len(names) })
	var lines []string
	var steps []time.Time
	seen := map[string]bool{first.last: true}
	joinerMoved, previous := "", ""
	for i, s := range samples {
		if len(s.admitted) > step {
			t.Errorf("at %.1fs: %d nodes admitted at once, above the step of %d", s.at.Sub(start).Seconds(), len(s.admitted), step)
		}
		if i < from {
			// Before the second edit: the first sample's status may still be the last rollout's
			// (a finished one restarts the step count).
			steps := s.step - samples[0].step
			if s.step < samples[0].step {
				steps = s.step
			}
			if moved := s.count("8") + s.count("10"); moved > step*int(steps) {
				t.Errorf("at %.1fs: %d nodes moved off cpu 6 after %d steps of %d", s.at.Sub(start).Seconds(), moved, steps, step)
			}
		}
		if i >= from {
			if allowed := step*int(s.step-first.step) + len(first.admitted); s.count("10") > allowed {
				t.Errorf("at %.1fs: %d nodes at cpu 10 after %d steps since the second edit (%d admitted then)",
					s.at.Sub(start).Seconds(), s.count("10"), s.step-first.step, len(first.admitted))
			}
			if s.count("8") > first.count("8")+len(first.admitted) {
				t.Errorf("at %.1fs: %d nodes at cpu 8 after the second edit, %d were then", s.at.Sub(start).Seconds(), s.count("8"), first.count("8"))
			}
			if c, ok := s.cpu[joiner]; ok && c != "4" && c != "10" {
				t.Errorf("at %.1fs: the joining node at cpu %s (want raw 4, then 10)", s.at.Sub(start).Seconds(), c)
			}
			if s.cpu[joiner] == "10" && joinerMoved == "" {
				joinerMoved = fmt.Sprintf("%.1fs, step %d", s.at.Sub(start).Seconds(), s.step)
			}
		}
		if s.last != "" && !seen[s.last] {
			seen[s.last] = true
			if at, err := time.Parse(time.RFC3339, s.last); err == nil {
				steps = append(steps, at)
			}
		}
		line := fmt.Sprintf("step %d admitted=%v waiting=%d at 6/8/10: %d/%d/%d joiner=%s",
			s.step, s.admitted, s.waiting, s.count("6"), s.count("8"), s.count("10"), s.cpu[joiner])
		if line != previous {
			previous = line
			lines = append(lines, fmt.Sprintf("%6.1fs  %s", s.at.Sub(start).Seconds(), line))
		}
	}
	for i := 1; i < len(steps); i++ {
		if gap := steps[i].Sub(steps[i-1]); gap < interval {
			t.Errorf("steps at %s and %s: %s apart, under the %s interval", steps[i-1], steps[i], gap, interval)
		}
	}
	t.Logf("second edit %.1fs after the first (step %d, at 8: %d, admitted then: %v, waiting %d); the joiner reached 10 at %s; every node at 10 %.1fs after the second edit (step %d); timeline (stored allocatable, status.rollout):\n  %s",
		second.Sub(start).Seconds(), first.step, first.count("8"), first.admitted, first.waiting, joinerMoved,
		time.Since(second).Seconds(), all.step, strings.Join(lines, "\n  "))
}

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

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/annotations"
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
		err := harness.Eventually(20*time.Second, 200*time.Millisecond, func() error {
			p, err := policies.Get(ctx, rolloutPolicy, metav1.GetOptions{})
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
		s := rolloutSample{at: time.Now(), cpu: map[string]string{}, gen: map[string]int64{}}
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "rollout=pool"})
		if err != nil {
			return s, err
		}
		for _, n := range list.Items {
			q := n.Status.Allocatable[corev1.ResourceCPU]
			s.cpu[n.Name] = q.String()
			if a, err := annotations.ParseApplied(n.Annotations[ocAppliedAnnotation]); err == nil {
				s.gen[n.Name] = a.Generation
			}
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
		deadline := time.Now().Add(timeout)
		for {
			s, err := sample()
			if err == nil {
				samples = append(samples, s)
				if done(s) {
					return s
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s (last sample: %d at 12, step %d, admitted %v, paused %v; err %v)",
					what, timeout, s.count("12"), s.step, s.admitted, s.paused, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
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
	t.Logf("TestRolloutStepsHollowNodes done in %.1fs", time.Since(start).Seconds())
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

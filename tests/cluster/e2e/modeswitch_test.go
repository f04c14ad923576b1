package e2e

// Issue 18, the mode switch under kubelet writes, on the real API server: fake kubelets write
// their status every second (raw cpu 7913m, a static policy cpu x1.5) while the replicas are
// rolled from --mode webhook to --mode in-process and back. No status write fails; every
// stored version of the nodes, from their first inflated one, carries exactly
// floor(7913m x 1.5) = 11869m with the listed annotations (never compounded), or, at most for
// one write at a hand-over, the kubelet's own value; the install's placeholder policy is filled
// in in in-process mode (and the webhook then patches nothing; the node webhook is left out of
// the configuration, as the compiled policy serves every node) and put back in webhook mode
// (the node webhook back, wide); `status` names the path of the nodes in each mode.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

const (
	msRaw      = "7913m"
	msInflated = "11869m" // floor(7913m x 1.5)
	msNodes    = 2
	msPeriod   = time.Second // the fake kubelets' nodeStatusUpdateFrequency
)

func TestModeSwitchUnderKubeletWrites(t *testing.T) {
	onShared(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cs := shared.Client
	dyn, err := dynamic.NewForConfig(shared.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	ns := uniqueName("modesw")
	// --heartbeat-refresh 0: every kubelet PATCH is stored on both paths, so the history below
	// holds every write. --shutdown-delay 2s: the preStop delay of deploy/ (chaos/README.md),
	// without which a replica stopping in a rollout refuses connections before the Service
	// drops it and the webhook fails open (the kubelet's value stored) in webhook mode.
	rs := startReplicasWithPolicy(t, ctx, ns, 2, "  nodeRatios:\n    cpu: \"1.5\"\n",
		"--mode", "webhook", "--policy-reload-interval", "1s", "--heartbeat-refresh", "0", "--shutdown-delay", "2s")
	t.Cleanup(func() {
		bg := context.Background()
		_ = dyn.Resource(mabGVR).Delete(bg, ns, metav1.DeleteOptions{})
		_ = dyn.Resource(mapGVR).Delete(bg, ns, metav1.DeleteOptions{})
	})
	if err := rs.in.WaitBootstrapped(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// The install's objects (deploy/components/in-process), there in both modes: the binding,
	// never written by the leader, and the placeholder policy, which matches nothing until the
	// leader fills it in (it cannot create one).
	shipped, err := install.InProcessBinding(ns)
	if err != nil {
		t.Fatal(err)
	}
	placeholder, err := install.InProcessPolicy(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(mapGVR).Create(ctx, placeholder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(mabGVR).Create(ctx, shipped, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := koNodeLabelKey + "=" + ns
	history := watchHistory(t, ctx, func(ctx context.Context) ([]*corev1.Node, string, error) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, "", err
		}
		return pointers(l.Items), l.ResourceVersion, nil
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = selector
		return cs.CoreV1().Nodes().Watch(ctx, o)
	})
	nodes, err := shared.StartFakeNodes(harness.FakeNodesOptions{Prefix: ns, Count: msNodes, Args: []string{
		"--cpu=8", "--allocatable-cpu=" + msRaw, "--labels=" + selector, "--delete-on-exit",
		"--status-update-frequency=" + msPeriod.String(), "--status-report-frequency=1m",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Stop() })
	for _, n := range nodes.Names {
		if err := waitNode(ctx, cs, n, 60*time.Second, msInflatedCheck); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("webhook mode: %v inflated %s -> %s (%.1fs)", nodes.Names, msRaw, msInflated, time.Since(start).Seconds())

	patched := func() float64 { return nodePatches(t, rs.in) }
	// compiled: whether the policy is filled in (there and not the placeholder), and whether
	// the binding is there.
	compiled := func() (policy, binding bool, err error) {
		p, perr := dyn.Resource(mapGVR).Get(ctx, ns, metav1.GetOptions{})
		_, berr := dyn.Resource(mabGVR).Get(ctx, ns, metav1.GetOptions{})
		for _, e := range []error{perr, berr} {
			if e != nil && !apierrors.IsNotFound(e) {
				return false, false, e
			}
		}
		return perr == nil && !isPlaceholder(p), berr == nil, nil
	}
	// paths checks the path `kube-overcommit status` shows for the nodes.
	paths := func(want string) {
		t.Helper()
		rows, _, err := statusJSON(shared, "--policy-file", rs.policy, "--webhook-config-name", ns)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, r := range rows {
			if slices.Contains(nodes.Names, r.Node) {
				seen++
				if r.Path != want {
					t.Errorf("status: %s path %q, want %q", r.Node, r.Path, want)
				}
			}
		}
		if seen != len(nodes.Names) {
			t.Errorf("status: %d rows of %d nodes", seen, len(nodes.Names))
		}
	}
	// writes waits until every node's kubelet has sent n more status PATCHes.
	writes := func(what string, n int64) {
		t.Helper()
		before, err := nodes.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if err := harness.Eventually(time.Duration(n)*msPeriod+20*time.Second, 200*time.Millisecond, func() error {
			st, err := nodes.Stats()
			if err != nil {
				return err
			}
			for _, name := range nodes.Names {
				if d := patchesSent(st, name) - patchesSent(before, name); d < n {
					return fmt.Errorf("%s: %d of %d PATCHes", name, d, n)
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// roll restarts the replicas one at a time with --mode mode (a Deployment's rollout).
	roll := func(mode string) {
		t.Helper()
		args := slices.Clone(rs.in.Args)
		i := slices.Index(args, "--mode")
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("no --mode in %v", args)
		}
		args[i+1] = mode
		rs.in.Args = args
		for _, r := range rs.in.Replicas() {
			if err := r.Restart(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := rs.in.WaitReady(len(rs.in.Replicas()), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	writes("webhook mode", 3)
	if p, b, err := compiled(); err != nil || p || !b {
		t.Fatalf("webhook mode: compiled policy %v, binding %v (%v), want the install's binding and placeholder", p, b, err)
	}
	paths("webhook")

	// 1. Webhook -> in-process, under the writes.
	switched := time.Now()
	roll("in-process")
	repairedWithin(t, "placeholder filled in beside the binding", 30*time.Second, func() error {
		if p, b, err := compiled(); err != nil || !p || !b {
			return fmt.Errorf("policy %v, binding %v (%v)", p, b, err)
		}
		return nil
	})
	// Every replica stepped back (its log says so since its last start) ...
	repairedWithin(t, "every replica leaves the nodes to the compiled policy", 30*time.Second, func() error {
		for _, r := range rs.in.Replicas() {
			if !stepsBack(r.LogPath) {
				return fmt.Errorf("%s has not stepped back", r.Identity())
			}
		}
		return nil
	})
	paths("in-process(" + ns + ")")
	// The compiled policy serves every node (one static policy): the leader leaves the node
	// webhook out of its configuration, so the API server evaluates nothing of it for node
	// writes ...
	nodeWebhook := func(want bool) func() error {
		return func() error {
			c, err := shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := hasNodeWebhook(c); got != want || narrowingOf(c) != "" {
				return fmt.Errorf("node webhook there %v (narrowing %q), want there %v and wide", got, narrowingOf(c), want)
			}
			return nil
		}
	}
	repairedWithin(t, "node webhook left out", 30*time.Second, nodeWebhook(false))
	// ... and the API server alone inflates the writes that follow.
	before := patched()
	writes("in-process mode", 3)
	if after := patched(); after != before {
		t.Errorf("in-process mode: the webhook patched %v node writes, want none", after-before)
	}
	t.Logf("in-process mode: placeholder filled in, replicas stepped back, writes inflated without a webhook patch (%.1fs after the rollout started)", time.Since(switched).Seconds())

	// 2. In-process -> webhook, under the writes.
	switched = time.Now()
	roll("webhook")
	repairedWithin(t, "placeholder put back, the install's binding kept", 30*time.Second, func() error {
		if p, b, err := compiled(); err != nil || p || !b {
			return fmt.Errorf("policy %v, binding %v (%v)", p, b, err)
		}
		return nil
	})
	paths("webhook")
	repairedWithin(t, "node webhook put back, wide", 30*time.Second, nodeWebhook(true))
	before = patched()
	writes("webhook mode again", 3)
	if after := patched(); after < before+msNodes {
		t.Errorf("webhook mode again: the webhook patched %v node writes, want at least %d", after-before, msNodes)
	}
	t.Logf("webhook mode again: placeholder put back, the webhook inflates (%.1fs after the rollout started)", time.Since(switched).Seconds())

	// Throughout: no failed write, and every stored version exact.
	st, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if w := st.StatusWrites; w.Failures != 0 || st.Registrations.Failures != 0 {
		t.Errorf("failed kubelet writes: status %d (last %q), registrations %d", w.Failures, w.LastError, st.Registrations.Failures)
	}
	var summary []string
	for _, n := range nodes.Names {
		inflated, raw, bad := checkVersions(history.of(n), ns)
		for _, b := range bad {
			t.Errorf("%s: %s", n, b)
		}
		summary = append(summary, fmt.Sprintf("%s: %d stored versions inflated exactly, %d with the kubelet's value at a hand-over, %d status PATCHes", n, inflated, raw, patchesSent(st, n)))
	}
	t.Logf("TestModeSwitchUnderKubeletWrites (%.0fs): %s", time.Since(start).Seconds(), strings.Join(summary, "; "))
}

// checkVersions checks a node's stored versions from its first inflated one: each is
// inflated exactly with the listed annotations, or carries the kubelet's value for one write
// (the next version is inflated again). It returns the counts and what is wrong.
func checkVersions(versions []version[*corev1.Node], policy string) (inflated, raw int, bad []string) {
	want, rawQ := resource.MustParse(msInflated), resource.MustParse(msRaw)
	// A policy from a file has no generation: neither path records one.
	wantRaw, wantApplied := "cpu="+msRaw, "policy="+policy+";ratios=cpu=1.5"
	first := slices.IndexFunc(versions, func(v version[*corev1.Node]) bool {
		return v.obj.Status.Allocatable.Cpu().Cmp(want) == 0
	})
	if first < 0 {
		return 0, 0, []string{"never stored inflated"}
	}
	rawRun := 0
	for _, v := range versions[first:] {
		n := v.obj
		cpu := n.Status.Allocatable.Cpu()
		switch {
		case cpu.Cmp(want) == 0:
			inflated++
			rawRun = 0
			if got := n.Annotations[rawKey]; got != wantRaw {
				bad = append(bad, fmt.Sprintf("rv %s: %s %q, want %q", n.ResourceVersion, rawKey, got, wantRaw))
			}
			if got := n.Annotations[appliedKey]; got != wantApplied {
				bad = append(bad, fmt.Sprintf("rv %s: %s %q, want %q", n.ResourceVersion, appliedKey, got, wantApplied))
			}
		case cpu.Cmp(rawQ) == 0:
			raw++
			rawRun++
			if rawRun > 1 {
				bad = append(bad, fmt.Sprintf("rv %s at %s: the kubelet's cpu %s stored for a second write in a row", n.ResourceVersion, v.at.Format(time.TimeOnly), cpu))
			}
		default:
			bad = append(bad, fmt.Sprintf("rv %s at %s: cpu %s, want %s (compounded or wrong)", n.ResourceVersion, v.at.Format(time.TimeOnly), cpu, msInflated))
		}
	}
	if rawRun > 0 {
		bad = append(bad, "the last stored version carries the kubelet's value")
	}
	return inflated, raw, bad
}

// stepsBack reports whether a replica's log says, since its last start, that the webhook
// leaves the static policies' nodes to the compiled policy.
func stepsBack(logPath string) bool {
	return logSince(logPath, "the webhook leaves the static policies' nodes")
}

// nodePatches is how many node reviews the replicas answered with a patch (since their starts).
func nodePatches(t *testing.T, in *install.Installation) float64 {
	t.Helper()
	n, err := sumReviews(in, func(l string) bool {
		return strings.Contains(l, `resource="node"`) && strings.Contains(l, `outcome="patched"`)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func msInflatedCheck(n *corev1.Node) error {
	if got := n.Status.Allocatable[corev1.ResourceCPU]; got.Cmp(resource.MustParse(msInflated)) != 0 {
		return fmt.Errorf("allocatable cpu %s, want %s", got.String(), msInflated)
	}
	return nil
}

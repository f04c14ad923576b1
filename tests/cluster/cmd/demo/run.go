package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
	"kube-overcommit/tests/cluster/internal/annotations"
	"kube-overcommit/tests/cluster/internal/runfiles"
)

const (
	demoLabel      = "overcommit.dev/demo"
	rawAnnotation  = annotations.Raw
	appliedAnnot   = annotations.Applied
	workloadNS     = "demo"
	workloadName   = "demo-app"
	policyName     = "demo"
	nodePrefix     = "node"
	keeperPidFile  = "demo-keeper.pid"
	keeperReadyTag = "demo-keeper.ready"
)

type demoOptions struct {
	keep        bool
	nodes       int
	labelled    int
	cpu, memory string
	pods        int32
	podCPU      string
	statusEvery time.Duration
	reportEvery time.Duration
	timeout     time.Duration
	runDir      string
}

// The fake kubelets write status every statusEvery, and an unchanged status every reportEvery
// (the kubelet's nodeStatusReportFrequency, 5 min by default). A policy change reaches a node
// through the leader's nudge within seconds either way; the usage step needs the reports (a
// usage node at its raw value is quiet, and follows a fall in usage at its next report).
func (o demoOptions) fakeNodeArgs() []string {
	return []string{"--cpu=" + o.cpu, "--memory=" + o.memory, "--images=50", "--resource-metrics",
		"--status-update-frequency=" + o.statusEvery.String(), "--status-report-frequency=" + o.reportEvery.String()}
}

func policyPath() string { return filepath.Join(harness.ModuleDir(), "cmd", "demo", "policy.yaml") }

func runDemo(args []string) int {
	o := demoOptions{}
	fs := pflag.NewFlagSet("demo run", pflag.ContinueOnError)
	keepEnv, _ := strconv.ParseBool(os.Getenv("DEMO_KEEP"))
	fs.BoolVar(&o.keep, "keep", keepEnv, "keep the control plane and 3 replicas running at the end (env DEMO_KEEP=1; make demo KEEP=1); stop with make cluster-down")
	fs.IntVar(&o.nodes, "nodes", 3, "fake nodes")
	fs.IntVar(&o.labelled, "labelled", 2, "how many of them get the label "+demoLabel+"=true the policy selects")
	fs.StringVar(&o.cpu, "cpu", "4", "CPU of each node")
	fs.StringVar(&o.memory, "memory", "8Gi", "memory of each node")
	fs.Int32Var(&o.pods, "pods", 24, "replicas of the demo Deployment")
	fs.StringVar(&o.podCPU, "pod-cpu", "1", "CPU request of each demo pod")
	fs.DurationVar(&o.statusEvery, "status-update-frequency", 5*time.Second, "fake kubelets' nodeStatusUpdateFrequency")
	fs.DurationVar(&o.reportEvery, "status-report-frequency", 10*time.Second, "fake kubelets' nodeStatusReportFrequency (kubelet default 5m; shortened for the usage step: a usage node at its raw value follows a fall in usage at its kubelet's next report)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "the whole demo ends (and cleans up) within this")
	fs.StringVar(&o.runDir, "run-dir", "", "control plane run directory (default: a temporary one; with --keep: tests/cluster/.run, as make cluster-up)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.labelled > o.nodes || o.nodes < 1 || o.pods < 1 {
		fmt.Fprintln(os.Stderr, "demo: need 1 <= --labelled <= --nodes and --pods >= 1")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d := &demo{o: o, start: time.Now()}
	err := d.run(ctx)
	cerr := d.cleanup(err == nil)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		fmt.Fprintf(os.Stderr, "\ndemo FAILED: %v\n", err)
		if d.c != nil && !d.removeRunDir {
			fmt.Fprintf(os.Stderr, "logs: %s/logs\n", d.c.RunDir)
		}
		return 1
	}
	if cerr != nil {
		fmt.Fprintf(os.Stderr, "\ndemo cleanup FAILED: %v\n", cerr)
		return 1
	}
	return 0
}

type demo struct {
	o            demoOptions
	start        time.Time
	c            *harness.Cluster
	in           *install.Installation
	removeRunDir bool
	keptRunning  bool
	nodes        []string
	// allocatable cpu per node as printed: before, with and after the policy, then at 20% and
	// 70% usage
	snapshots [][]string
	// demo pods bound at each usage step, as the summary prints them
	usageCounts   []string
	metricsServer *harness.MetricsServer
}

func (d *demo) step(format string, a ...any) {
	fmt.Printf("\n==> %s\n", fmt.Sprintf(format, a...))
}

func (d *demo) info(format string, a ...any) {
	fmt.Printf("    [%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, a...))
}

func (d *demo) run(ctx context.Context) error {
	if err := d.startControlPlane(ctx); err != nil {
		return err
	}
	if err := d.installWebhook(ctx); err != nil {
		return err
	}
	if err := d.labelNodes(ctx); err != nil {
		return err
	}
	d.step("Allocatable before any policy (from the API server)")
	if err := d.printNodes(ctx); err != nil {
		return err
	}

	d.step("A Deployment of %d pods requesting %s CPU each: more than the nodes hold", d.o.pods, d.o.podCPU)
	if err := d.createWorkload(ctx); err != nil {
		return err
	}
	without, err := d.waitScheduling(ctx, "without a policy")
	if err != nil {
		return err
	}

	d.step("Applying the policy %s", relPath(policyPath()))
	applied := time.Now()
	if err := d.applyFile(policyPath()); err != nil {
		return err
	}
	d.info("waiting for every labelled node: the leader nudges each one (an empty status PATCH the webhook fills in); their kubelets report an unchanged status only every %v", d.o.reportEvery)
	if err := d.waitAllocatable(ctx, true); err != nil {
		return err
	}
	d.info("time to effect: every labelled node carries the policy %.1f s after kubectl apply started", time.Since(applied).Seconds())
	if err := d.showPolicy(ctx, "NodesOvercommitted"); err != nil {
		return err
	}
	d.step("Allocatable with the policy")
	if err := d.printNodes(ctx); err != nil {
		return err
	}
	with, err := d.waitScheduling(ctx, "with the policy")
	if err != nil {
		return err
	}

	d.step("Deleting the policy: the leader nudges the nodes back to their kubelet's values")
	deleted := time.Now()
	if out, err := d.c.Kubectl("delete", "overcommitpolicy", policyName); err != nil {
		return fmt.Errorf("kubectl delete: %w\n%s", err, out)
	} else {
		d.info("kubectl: %s", strings.TrimSpace(out))
	}
	if err := d.waitAllocatable(ctx, false); err != nil {
		return err
	}
	d.info("time to effect: every labelled node is back to its kubelet's values %.1f s after kubectl delete started", time.Since(deleted).Seconds())
	if err := d.showNodeEvents(d.nodes[0], "Restored"); err != nil {
		return err
	}
	d.step("Allocatable after deleting the policy")
	if err := d.printNodes(ctx); err != nil {
		return err
	}
	d.info("pods already bound stay where they are: the scheduler never evicts, so a node can hold more")
	d.info("requests than its allocatable after a ratio is lowered or removed (SECURITY.md: operational risks)")

	if err := d.usageStep(ctx); err != nil {
		return err
	}

	d.step("Summary")
	d.printSummary(without, with)
	return nil
}

// applyFile prints the manifest at path (without its comments) and applies it with kubectl.
func (d *demo) applyFile(path string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(text)), "\n") {
		if !strings.HasPrefix(l, "#") {
			fmt.Println("      " + l)
		}
	}
	out, err := d.c.Kubectl("apply", "-f", path)
	if err != nil {
		return fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	d.info("kubectl: %s", strings.TrimSpace(out))
	return nil
}

func relPath(p string) string {
	if r, err := filepath.Rel(install.RepoRoot(), p); err == nil {
		return r
	}
	return p
}

func (d *demo) startControlPlane(ctx context.Context) error {
	d.step("Starting the local control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, %d fake nodes (%s CPU, %s)", d.o.nodes, d.o.cpu, d.o.memory)
	var err error
	if !d.o.keep {
		if d.o.runDir == "" {
			if d.o.runDir, err = os.MkdirTemp("", "kube-overcommit-demo-"); err != nil {
				return err
			}
			d.removeRunDir = true
		}
		// Tied to this process (--exit-with-pid): nothing outlives the demo, even if it is killed.
		d.c, err = harness.New(harness.Options{Nodes: d.o.nodes, FakeNodeArgs: d.o.fakeNodeArgs(), RunDir: d.o.runDir})
		if err != nil {
			d.c = nil
			return err
		}
	} else {
		if err := d.startKeptControlPlane(ctx); err != nil {
			return err
		}
	}
	for i := 0; i < d.o.nodes; i++ {
		d.nodes = append(d.nodes, fmt.Sprintf("%s-%d", nodePrefix, i))
	}
	d.info("API server %s ready; run dir %s", d.c.Server, d.c.RunDir)
	return nil
}

// startKeptControlPlane starts the control plane as `make cluster-up` does (default run dir,
// stops by itself after 12 h), not tied to this process, and connects to it.
func (d *demo) startKeptControlPlane(ctx context.Context) error {
	if d.o.runDir == "" {
		d.o.runDir = filepath.Join(harness.ModuleDir(), ".run")
	}
	run, err := runfiles.Abs(d.o.runDir)
	if err != nil {
		return err
	}
	d.o.runDir = string(run)
	if _, err := os.Stat(run.Ready()); err == nil {
		if len(run.Processes()) > 0 {
			return fmt.Errorf("a control plane is already running in %s: stop it first with `make cluster-down`", run)
		}
	}
	bin, err := harness.Binary()
	if err != nil {
		return err
	}
	args := []string{"up", "--run-dir=" + string(run), fmt.Sprintf("--nodes=%d", d.o.nodes), "--max-lifetime=12h", "--timeout=3m",
		"--fake-node-arg=--prefix=" + nodePrefix}
	for _, a := range d.o.fakeNodeArgs() {
		args = append(args, "--fake-node-arg="+a)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KCP_RUN_DIR="+string(run))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kcp up: %w\n%s", err, out)
	}
	// Connect as to any running control plane: Stop then leaves it running.
	if err := os.Setenv("KCP_KUBECONFIG", run.Kubeconfig()); err != nil {
		return err
	}
	d.c, err = harness.New(harness.Options{})
	if err != nil {
		d.c = nil
		return err
	}
	return nil
}

// serviceAccount is the replicas' identity, as in a Pod of deploy/ (the nudges' match
// conditions and the node guard name it).
const serviceAccount = "system:serviceaccount:" + install.DefaultNamespace + ":kube-overcommit"

// rbacManifests are deploy/'s RBAC and admission guards, applied before the replicas start.
var rbacManifests = []string{"deploy/base/rbac.yaml", "deploy/components/webhook-guard/validatingadmissionpolicy.yaml",
	"deploy/components/webhook-guard/node-guard.yaml"}

func installOptions() install.Options {
	return install.Options{
		Namespace: install.DefaultNamespace,
		Replicas:  3,
		CRD:       install.DefaultCRD(),
		// The kubelet's Secret volume is not instantaneous either.
		SecretDelay: time.Second,
		Args:        []string{"--shutdown-delay=1s", "--shutdown-grace=10s", "--usage-interval=" + usageInterval.String()},
		// The replicas act as the ServiceAccount, under deploy/'s RBAC only (kube-rs impersonation).
		Env: []string{"KUBE_RS_DEBUG_IMPERSONATE_USER=" + serviceAccount,
			"KUBE_RS_DEBUG_IMPERSONATE_GROUP=system:serviceaccounts,system:serviceaccounts:" + install.DefaultNamespace + ",system:authenticated"},
	}
}

// applyRBAC creates the namespace and applies deploy/'s RBAC and guards.
func applyRBAC(ctx context.Context, c *harness.Cluster) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: install.DefaultNamespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for _, f := range rbacManifests {
		if out, err := c.Kubectl("apply", "--server-side", "-f", filepath.Join(install.RepoRoot(), f)); err != nil {
			return fmt.Errorf("apply %s: %w\n%s", f, err, out)
		}
	}
	return nil
}

func (d *demo) installWebhook(ctx context.Context) error {
	o := installOptions()
	d.step("Installing kube-overcommit: the OvercommitPolicy CRD, namespace %s, %d replicas of %s as ServiceAccount %s (%s)",
		o.Namespace, o.Replicas, relPath(mustBinary()), serviceAccount, strings.Join(rbacManifests, ", "))
	if err := applyRBAC(ctx, d.c); err != nil {
		return err
	}
	var err error
	d.in, err = install.Install(ctx, d.c, o)
	if err != nil {
		return err
	}
	for _, r := range d.in.Replicas() {
		d.info("replica %s: webhook https://%s, probes http://%s, certificates in its Secret volume %s", r.Identity(), r.Listen, r.Probe, r.TLSDir)
	}
	d.info("waiting for a leader to create the CA, the serving certificate and the MutatingWebhookConfiguration")
	if err := d.in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		return err
	}
	cfg, err := d.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, d.in.WebhookConfig, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var hooks []string
	for _, w := range cfg.Webhooks {
		var rules []string
		for _, r := range w.Rules {
			for _, op := range r.Operations {
				rules = append(rules, string(op)+" "+strings.Join(r.Resources, ","))
			}
		}
		fp := "?"
		if w.FailurePolicy != nil {
			fp = string(*w.FailurePolicy)
		}
		hooks = append(hooks, fmt.Sprintf("%s (%s; failurePolicy %s, timeout %ds)", w.Name, strings.Join(rules, ", "), fp, ptr.Deref(w.TimeoutSeconds, 10)))
	}
	d.info("leader: %s; webhook configuration %s: %s", d.in.LeaderIdentity(ctx), cfg.Name, strings.Join(hooks, "; "))
	d.info("%d replicas ready; the API server reaches them through Service %s/%s", len(d.in.ReadyReplicas()), d.in.Namespace, d.in.Service)
	return nil
}

func mustBinary() string {
	b, err := install.Binary()
	if err != nil {
		return "kube-overcommit"
	}
	return b
}

func (d *demo) labelNodes(ctx context.Context) error {
	var labelled []string
	for i := 0; i < d.o.labelled; i++ {
		n := d.nodes[i]
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, demoLabel)
		if _, err := d.c.Client.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label %s: %w", n, err)
		}
		labelled = append(labelled, n)
	}
	others := "every node is"
	if rest := d.nodes[d.o.labelled:]; len(rest) > 0 {
		others = "not " + strings.Join(rest, ", ")
	}
	d.info("labelled %s with %s=true: the policy selects them (%s)", strings.Join(labelled, ", "), demoLabel, others)
	return nil
}

// printNodes prints the nodes as the API server stores them, and the pods bound to each.
func (d *demo) printNodes(ctx context.Context) error {
	pods, err := d.podsPerNode(ctx)
	if err != nil {
		return err
	}
	var snap []string
	defer func() { d.snapshots = append(d.snapshots, snap) }()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "    NODE\tLABELLED\tCAPACITY CPU\tALLOCATABLE CPU\tALLOCATABLE MEMORY\tRAW (annotation)\tPOLICY\tDEMO PODS")
	for _, name := range d.nodes {
		n, err := d.c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		capCPU := n.Status.Capacity[corev1.ResourceCPU]
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		mem := n.Status.Allocatable[corev1.ResourceMemory]
		snap = append(snap, cpu.String())
		raw, policy := "-", "-"
		if v, ok := n.Annotations[rawAnnotation]; ok {
			raw = v
		}
		if v, ok := n.Annotations[appliedAnnot]; ok {
			if a, err := annotations.ParseApplied(v); err == nil && a.Policy != "" {
				var rs []string
				for k, r := range a.Ratios {
					rs = append(rs, k+" x"+r)
				}
				sort.Strings(rs)
				policy = a.Policy + " (" + strings.Join(rs, ", ") + ")"
			} else {
				policy = v
			}
		}
		fmt.Fprintf(w, "    %s\t%v\t%s\t%s\t%s\t%s\t%s\t%d\n", name, n.Labels[demoLabel] == "true", capCPU.String(), cpu.String(), mem.String(), raw, policy, pods[name])
	}
	return w.Flush()
}

func (d *demo) podsPerNode(ctx context.Context) (map[string]int, error) {
	list, err := d.c.Client.CoreV1().Pods(workloadNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + workloadName})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	out := map[string]int{}
	if list != nil {
		for _, p := range list.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				out[p.Spec.NodeName]++
			}
		}
	}
	return out, nil
}

func (d *demo) createWorkload(ctx context.Context) error {
	cs := d.c.Client
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workloadNS}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	labels := map[string]string{"app": workloadName}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: workloadName, Namespace: workloadNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(d.o.pods),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:  "app",
						Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU:    resource.MustParse(d.o.podCPU),
							corev1.ResourceMemory: resource.MustParse("256Mi"),
						}},
					}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments(workloadNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create deployment: %w", err)
	}
	d.info("deployment %s/%s created (pause pods: the fake kubelets mark bound pods Running)", workloadNS, workloadName)
	return nil
}

// capacityFor is how many demo pods the nodes' current allocatable cpu holds.
func (d *demo) capacityFor(ctx context.Context) (int, error) {
	per := resource.MustParse(d.o.podCPU)
	total := 0
	for _, name := range d.nodes {
		n, err := d.c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		total += int(cpu.MilliValue() / per.MilliValue())
	}
	return total, nil
}

// waitScheduling waits until the scheduler is done with the Deployment: every pod exists and
// is either bound (and Running) or Unschedulable, and as many are bound as the nodes hold.
func (d *demo) waitScheduling(ctx context.Context, what string) (int, error) {
	want, err := d.capacityFor(ctx)
	if err != nil {
		return 0, err
	}
	if want > int(d.o.pods) {
		want = int(d.o.pods)
	}
	var bound, running, pending int
	var reason string
	err = harness.Eventually(90*time.Second, 300*time.Millisecond, func() error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		list, err := d.c.Client.CoreV1().Pods(workloadNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + workloadName})
		if err != nil {
			return err
		}
		bound, running, pending, reason = 0, 0, 0, ""
		undecided := 0
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			switch {
			case p.Spec.NodeName != "":
				bound++
				if p.Status.Phase == corev1.PodRunning {
					running++
				}
			default:
				pending++
				unschedulable := false
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
						unschedulable, reason = true, c.Message
					}
				}
				if !unschedulable {
					undecided++
				}
			}
		}
		if bound+pending < int(d.o.pods) {
			return fmt.Errorf("%d of %d pods created", bound+pending, d.o.pods)
		}
		if bound != want || running != bound || undecided > 0 {
			return fmt.Errorf("%d pods bound (%d Running), %d waiting for the scheduler; the nodes hold %d", bound, running, undecided, want)
		}
		return nil
	})
	if err != nil {
		return bound, fmt.Errorf("scheduling %s: %w", what, err)
	}
	d.info("%s: %d of %d pods scheduled and Running, %d Pending", what, bound, d.o.pods, pending)
	if pending > 0 && reason != "" {
		d.info("the scheduler says: %s", reason)
	}
	return bound, nil
}

// waitAllocatable waits for the labelled nodes' stored allocatable cpu to be inflated (or back
// to the raw value), and checks that the unlabelled ones never changed.
func (d *demo) waitAllocatable(ctx context.Context, inflated bool) error {
	start := time.Now()
	capCPU := resource.MustParse(d.o.cpu)
	seen := map[string]time.Duration{}
	err := harness.Eventually(90*time.Second, 200*time.Millisecond, func() error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var waiting []string
		for i, name := range d.nodes {
			n, err := d.c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cpu := n.Status.Allocatable[corev1.ResourceCPU]
			_, hasRaw := n.Annotations[rawAnnotation]
			if i >= d.o.labelled {
				if cpu.Cmp(capCPU) != 0 || hasRaw {
					return fmt.Errorf("unlabelled node %s changed: allocatable cpu %s", name, cpu.String())
				}
				continue
			}
			ok := cpu.Cmp(capCPU) != 0 && hasRaw
			if !inflated {
				ok = cpu.Cmp(capCPU) == 0 && !hasRaw
			}
			if !ok {
				waiting = append(waiting, fmt.Sprintf("%s (cpu %s)", name, cpu.String()))
				continue
			}
			if _, done := seen[name]; !done {
				seen[name] = time.Since(start)
				d.info("%s wrote its status: allocatable cpu %s", name, cpu.String())
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("waiting for %s", strings.Join(waiting, ", "))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("allocatable: %w", err)
	}
	return nil
}

func (d *demo) printSummary(without, with int) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "    ALLOCATABLE CPU (API server)\t%s\tDEMO PODS SCHEDULED (of %d, %s CPU each)\n", strings.Join(d.nodes, "\t"), d.o.pods, d.o.podCPU)
	titles := []string{"no policy", "policy " + policyName + " (cpu x2, labelled nodes)", "policy deleted",
		"policy " + usagePolicyName + ", usage 20%", "policy " + usagePolicyName + ", usage 70%"}
	counts := append([]string{strconv.Itoa(without), fmt.Sprintf("%d (%+d)", with, with-without), "bound pods stay"}, d.usageCounts...)
	for i, snap := range d.snapshots {
		if i >= len(titles) || i >= len(counts) || len(snap) != len(d.nodes) {
			break
		}
		fmt.Fprintf(w, "    %s\t%s\t%s\n", titles[i], strings.Join(snap, "\t"), counts[i])
	}
	_ = w.Flush()
	fmt.Printf("\n    With the policy the scheduler placed %d more pods on the same %d nodes; deleting it restored the kubelet's values.\n", with-without, d.o.nodes)
	fmt.Printf("    With the usage policy allocatable followed the nodes' usage: headroom below the target at 20%%, none at 70%%.\n")
	if c, err := d.apiserverWebhookCounts(); err == nil {
		fmt.Printf("    The API server called the webhook %.0f times (node status writes, pod creations): %.0f answered, %.0f failed open.\n", c.total, c.answered, c.failOpen)
	}
	fmt.Printf("    Leader: %s; replicas ready: %d of %d.\n", d.in.LeaderIdentity(context.Background()), len(d.in.ReadyReplicas()), len(d.in.Replicas()))
}

type webhookCounts struct{ total, answered, failOpen float64 }

// apiserverWebhookCounts reads the API server's own metrics of calls to this project's webhooks.
func (d *demo) apiserverWebhookCounts() (webhookCounts, error) {
	var c webhookCounts
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := d.c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, `overcommit.dev"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "apiserver_admission_webhook_fail_open_count{"):
			c.failOpen += v
		case strings.HasPrefix(line, "apiserver_admission_webhook_request_total{"):
			c.total += v
			if strings.Contains(line, `code="200"`) {
				c.answered += v
			}
		}
	}
	return c, nil
}

// cleanup stops what the demo started. With --keep after a successful run, the replicas are
// handed to a detached keeper and the control plane stays up.
func (d *demo) cleanup(ok bool) error {
	var errs []error
	if d.in != nil {
		if err := d.in.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop replicas: %w", err))
		}
	}
	if d.c == nil {
		return errors.Join(errs...)
	}
	if d.o.keep && ok {
		d.step("Keeping the cluster running")
		if err := startKeeper(d.c.RunDir); err != nil {
			errs = append(errs, err)
		} else {
			d.info("3 replicas run on, kept by a detached process (log: %s)", filepath.Join(relPath(d.c.RunDir), "logs", "demo-keeper.log"))
			d.printKeepHelp()
			return errors.Join(errs...)
		}
	}
	d.step("Cleaning up")
	if d.metricsServer != nil {
		if err := d.metricsServer.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop metrics-server: %w", err))
		}
	}
	if d.o.keep {
		// The kept control plane was not started by harness.New: stop it here.
		d.c.External = false
	}
	if err := d.c.Stop(); err != nil {
		errs = append(errs, err)
	}
	if left := leftovers(d.c.RunDir); left != "" {
		errs = append(errs, fmt.Errorf("processes left behind: %s", left))
	}
	if len(errs) == 0 {
		d.info("control plane and replicas stopped; no process of the demo is left (pgrep -f %s finds none)", d.c.RunDir)
		if d.removeRunDir && ok {
			_ = os.RemoveAll(d.c.RunDir)
		} else {
			d.removeRunDir = false
		}
	}
	return errors.Join(errs...)
}

func (d *demo) printKeepHelp() {
	kcp := "tests/cluster/kcp.sh"
	fmt.Printf(`
    The control plane runs in %s (it stops by itself after 12 h). Look around:
      %s kubectl get nodes -L %s
      %s kubectl get node %s -o jsonpath='{.status.allocatable}{"\n"}{.metadata.annotations}{"\n"}'
      %s kubectl get pods -n %s -o wide
      %s kubectl get overcommitpolicies
      %s kubectl get mutatingwebhookconfiguration %s -o yaml
      %s kubectl get lease -n %s
      %s kubectl apply -f %s      # the policy again; delete it with: kubectl delete overcommitpolicy %s
      tail -f %s/logs/%s-replica-*.log
    Stop everything:
      make cluster-down
`, relPath(d.c.RunDir), kcp, demoLabel, kcp, d.nodes[0], kcp, workloadNS, kcp, kcp, install.DefaultWebhookConfig,
		kcp, install.DefaultNamespace, kcp, relPath(policyPath()), policyName, relPath(d.c.RunDir), install.DefaultNamespace)
}

// leftovers lists processes whose command line names the run directory (pgrep -f), other than
// this one.
func leftovers(runDir string) string {
	out, err := exec.Command("pgrep", "-af", runDir).Output()
	if err != nil {
		return "" // pgrep exits 1 when nothing matches
	}
	self, parent := strconv.Itoa(os.Getpid())+" ", strconv.Itoa(os.Getppid())+" "
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" && !strings.HasPrefix(l, self) && !strings.HasPrefix(l, parent) {
			left = append(left, l)
		}
	}
	return strings.Join(left, "; ")
}

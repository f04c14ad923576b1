package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"kube-overcommit/tests/cluster/harness"
)

type clusterOptions struct {
	kubeconfig, context, namespace, selector, kubectl string
	apiserverLog, replicaLogs                         string
	confirm                                           bool
	duration, killPhase, killInterval                 time.Duration
	nodes, replicas, webhookTimeout                   int
	statusEvery                                       time.Duration
	skip                                              []string
}

const confirmFlag = "i-understand-this-deletes-pods"

func runCluster(args []string) int {
	var o clusterOptions
	fs := pflag.NewFlagSet("chaos cluster", pflag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (required; $KUBECONFIG is not used)")
	fs.StringVar(&o.context, "context", "", "context in that kubeconfig (required; the current context is not used)")
	fs.BoolVar(&o.confirm, confirmFlag, false, "confirm: this deletes kube-overcommit pods, Secrets and the webhook configuration, and adds fake Nodes")
	fs.StringVar(&o.namespace, "namespace", "kube-overcommit", "namespace of the installed kube-overcommit")
	fs.StringVar(&o.selector, "selector", "app.kubernetes.io/name=kube-overcommit", "label selector of the kube-overcommit pods")
	fs.StringVar(&o.kubectl, "kubectl", "kubectl", "kubectl binary used for the pod deletions")
	fs.DurationVar(&o.duration, "duration", 0, "run fault cycles until this much time has passed (0: one cycle)")
	fs.DurationVar(&o.killPhase, "kill-phase", 60*time.Second, "length of the graceful and forced deletion phases")
	fs.DurationVar(&o.killInterval, "kill-interval", 10*time.Second, "time between two pod deletions")
	fs.IntVar(&o.nodes, "nodes", 5, "fake nodes (tainted, labelled overcommit.dev/chaos=true, deleted at the end)")
	fs.IntVar(&o.replicas, "replicas", 3, "replicas the Deployment runs")
	fs.IntVar(&o.webhookTimeout, "webhook-timeout", 2, "webhook timeoutSeconds (writes slower than this are counted)")
	fs.DurationVar(&o.statusEvery, "status-update-frequency", 2*time.Second, "fake nodes' status update frequency")
	fs.StringSliceVar(&o.skip, "skip", nil, "phases to leave out: graceful,forced,rotation,deletions")
	fs.StringVar(&o.apiserverLog, "apiserver-log", "", "API server log file(s) (glob) to count x509 errors of webhook calls in, where it can be read (e.g. a kubeadm or kind node); without it x509 errors are seen only in the writes' errors, which failurePolicy Ignore hides")
	fs.StringVar(&o.replicaLogs, "replica-logs", "", "replica log files (glob, e.g. collected by `kubectl logs -f`) to count TLS handshakes the API server aborted in (needs RUST_LOG=info,kube_overcommit::server=debug)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.kubeconfig == "" || o.context == "" || !o.confirm {
		fmt.Fprintf(os.Stderr, "chaos cluster: refusing to run: this is destructive (it deletes kube-overcommit pods, its Secrets and its\n"+
			"webhook configuration). Give --kubeconfig PATH, --context NAME and --%s.\n", confirmFlag)
		return 2
	}
	if o.replicas < 3 {
		fmt.Fprintln(os.Stderr, "chaos cluster: --replicas must be at least 3")
		return 2
	}
	// Checked before anything is created: a missing kubectl would otherwise show only at the
	// first pod deletion, after the fake nodes, the policy and the baseline.
	if _, err := exec.LookPath(o.kubectl); err != nil {
		fmt.Fprintf(os.Stderr, "chaos cluster: --kubectl %s: %v\n", o.kubectl, err)
		return 2
	}
	broken, err := clusterRun(o)
	return verdict("cluster", broken, err)
}

var policyGVR = schema.GroupVersionResource{Group: "overcommit.dev", Version: "v1alpha1", Resource: "overcommitpolicies"}

func clusterRun(o clusterOptions) (broken []string, err error) {
	budget := o.duration
	if budget == 0 {
		budget = 10 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget+10*time.Minute)
	defer cancel()
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	// One kubeconfig with only the chosen context, for this process and the fake nodes.
	raw, err := clientcmd.LoadFromFile(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	if _, ok := raw.Contexts[o.context]; !ok {
		return nil, fmt.Errorf("context %q not in %s", o.context, o.kubeconfig)
	}
	raw.CurrentContext = o.context
	if err := clientcmdapi.MinifyConfig(raw); err != nil {
		return nil, err
	}
	if err := clientcmdapi.FlattenConfig(raw); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "chaos-cluster-")
	if err != nil {
		return nil, err
	}
	defer func() {
		// The fake nodes' log and statistics are in tmp: kept when the run failed.
		if err == nil && len(broken) == 0 {
			_ = os.RemoveAll(tmp)
		} else {
			progress("fake-node logs and statistics kept in %s", tmp)
		}
	}()
	flat := filepath.Join(tmp, "kubeconfig")
	if err := clientcmd.WriteToFile(*raw, flat); err != nil {
		return nil, err
	}
	_ = os.Chmod(flat, 0o600)
	if err := os.Setenv("KCP_KUBECONFIG", flat); err != nil {
		return nil, err
	}
	c, err := harness.New(harness.Options{})
	if err != nil {
		return nil, err
	}
	client := c.Client
	dyn, err := dynamic.NewForConfig(c.RestConfig)
	if err != nil {
		return nil, err
	}
	progress("cluster %s (context %s), kube-overcommit in namespace %s", c.Server, o.context, o.namespace)

	n := defaultNames(o.namespace)
	tg := &podTarget{o: o, client: client, n: n}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, n.WebhookConfig, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("is kube-overcommit installed? %w", err)
	}
	if r := tg.Ready(ctx); len(r) < o.replicas {
		return nil, fmt.Errorf("%d ready kube-overcommit pods (%s in %s), want %d", len(r), o.selector, o.namespace, o.replicas)
	}

	t := newTally()
	suffix := fmt.Sprintf("%04x", rand.IntN(1<<16))
	prefix, podNS, policyName := "chaos-"+suffix, "kube-overcommit-chaos-"+suffix, "chaos-"+suffix
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = client.CoreV1().Namespaces().Delete(dctx, podNS, metav1.DeleteOptions{})
		_ = dyn.Resource(policyGVR).Delete(dctx, policyName, metav1.DeleteOptions{})
		progress("removed namespace %s and policy %s", podNS, policyName)
	}()
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "overcommit.dev/v1alpha1", "kind": "OvercommitPolicy",
		"metadata": map[string]any{"name": policyName},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"overcommit.dev/chaos": suffix}},
			"priority":     int64(1000),
			"nodeRatios":   map[string]any{"cpu": "2"},
		},
	}}
	if _, err := dyn.Resource(policyGVR).Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create OvercommitPolicy: %w", err)
	}

	fakeNodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: prefix, Count: o.nodes, Args: []string{
		"--kubeconfig=" + flat, "--cpu=8", "--allocatable-cpu=7", "--images=50", "--labels=overcommit.dev/chaos=" + suffix,
		"--status-update-frequency=" + o.statusEvery.String(), "--status-report-frequency=" + (3 * o.statusEvery).String(),
		"--slow-threshold=" + secs(time.Duration(o.webhookTimeout)*time.Second), "--run-pods=false", "--delete-on-exit", "--qps=20"}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = fakeNodes.Stop() }()
	// Keep real workloads off the fake nodes.
	taint := corev1.Taint{Key: "overcommit.dev/chaos", Value: suffix, Effect: corev1.TaintEffectNoSchedule}
	for _, name := range fakeNodes.Names {
		err := waitFor(ctx, 60*time.Second, 200*time.Millisecond, "taint "+name, func() error {
			patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": []corev1.Taint{taint}}})
			_, err := client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		if err != nil {
			return nil, err
		}
	}

	obsCtx, stopObservers := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(5)
	glob := func(pattern string) func() []string {
		return func() []string {
			if pattern == "" {
				return nil
			}
			l, _ := filepath.Glob(pattern)
			return l
		}
	}
	go tailLogs(obsCtx, &wg, t, glob(o.apiserverLog), x509InAPIServerLog, func(p *Phase, k int64) { p.X509APIServer += k }, "x509 in the API server log")
	go tailLogs(obsCtx, &wg, t, glob(o.replicaLogs), x509InReplicaLog, func(p *Phase, k int64) { p.X509Replica += k }, "TLS alert in a replica log")
	go pollFakeNodeStats(obsCtx, &wg, t, fakeNodes.StatsFile)
	go scrapeAPIServerMetrics(obsCtx, &wg, t, client, webhookNameSuffix)
	go createPods(obsCtx, &wg, t, client, podNS, time.Second, 20, map[string]string{"overcommit.dev/chaos": suffix},
		[]corev1.Toleration{{Key: taint.Key, Operator: corev1.TolerationOpEqual, Value: suffix, Effect: corev1.TaintEffectNoSchedule}})
	stopLoad := func() { stopObservers(); wg.Wait() }
	defer stopLoad()
	if o.apiserverLog != "" || o.replicaLogs != "" {
		progress("x509 evidence read from %d API server log(s) (%q) and %d replica log(s) (%q, re-listed every second)",
			len(glob(o.apiserverLog)()), o.apiserverLog, len(glob(o.replicaLogs)()), o.replicaLogs)
	}
	if o.apiserverLog == "" {
		// The API server's metrics do not tell an x509 failure from any other failed call (both
		// are fail-open counts), and with failurePolicy Ignore the writes never see it.
		t.Note("x509 errors: no --apiserver-log, so only errors of the writes themselves are counted, and failurePolicy Ignore hides x509 errors from them; TLS failures show as fail-open")
	}

	sc := &scenario{t: t, tg: tg, client: client, n: n, settle: 5 * time.Minute, rotationTimeout: 10 * time.Minute}
	skip := map[string]bool{}
	for _, s := range o.skip {
		skip[s] = true
	}
	start := time.Now()
	for cycle := 1; ctx.Err() == nil; cycle++ {
		progress("cycle %d", cycle)
		t.Begin("baseline", true, false)
		sleepCtx(ctx, 15*time.Second)
		if !skip["graceful"] {
			t.Begin("delete-pod", true, false)
			sc.kills(ctx, o.killPhase, o.killInterval, false)
			sc.settlePhase(ctx)
		}
		if !skip["forced"] {
			t.Begin("delete-pod-force", false, false)
			sc.kills(ctx, o.killPhase, o.killInterval, true)
			sc.settlePhase(ctx)
		}
		if !skip["rotation"] {
			t.Begin("leader-kill-rotation", false, false)
			sc.leafRotation(ctx)
			sc.caRotation(ctx)
			sc.settlePhase(ctx)
		}
		if !skip["deletions"] {
			t.Begin("deletions", false, false)
			sc.deletions(ctx)
			sc.settlePhase(ctx)
		}
		if o.duration == 0 || time.Since(start) >= o.duration {
			break
		}
	}
	sleepCtx(ctx, 5*time.Second)
	if ctx.Err() != nil {
		t.Error("run interrupted or over its time bound: %v", ctx.Err())
	}
	stopLoad()
	if err := fakeNodes.Stop(); err != nil {
		broken = append(broken, "fake nodes: "+err.Error())
	}
	broken = append(t.Finish(os.Stdout, o.webhookTimeout), broken...)
	return broken, nil
}

// podTarget acts on the pods of an installed kube-overcommit.
type podTarget struct {
	o      clusterOptions
	client kubernetes.Interface
	n      names
}

func (p *podTarget) Replicas() int { return p.o.replicas }

func (p *podTarget) Ready(ctx context.Context) []string {
	pods, err := p.client.CoreV1().Pods(p.n.Namespace).List(ctx, metav1.ListOptions{LabelSelector: p.o.selector})
	if err != nil {
		return nil
	}
	var out []string
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp != nil {
			continue
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				out = append(out, pod.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

func (p *podTarget) Stop(ctx context.Context, pod string, force bool) error {
	args := []string{"--kubeconfig=" + p.o.kubeconfig, "--context=" + p.o.context, "-n", p.n.Namespace, "delete", "pod", pod, "--wait=false"}
	if force {
		args = append(args, "--grace-period=0", "--force")
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, p.o.kubectl, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl %s: %w: %s", strings.Join(args[2:], " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Leader is the Lease holder while its pod lives: after a forced deletion the Lease still names
// the deleted pod until it expires, and that pod cannot be killed again.
func (p *podTarget) Leader(ctx context.Context) string {
	holder := leaseHolder(ctx, p.client, p.n)
	if holder == "" {
		return ""
	}
	pod, err := p.client.CoreV1().Pods(p.n.Namespace).Get(ctx, holder, metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp != nil {
		return ""
	}
	return holder
}

// Rotate sets the same annotation `kube-overcommit rotate` sets (the binary need not be on
// the machine running the chaos).
func (p *podTarget) Rotate(ctx context.Context, ca bool) error {
	kind := "leaf"
	if ca {
		kind = "ca"
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		"overcommit.dev/rotate": kind, "overcommit.dev/rotate-requested-at": time.Now().UTC().Format(time.RFC3339)}}})
	_, err := p.client.CoreV1().Secrets(p.n.Namespace).Patch(ctx, p.n.ServingSecret, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("serving secret %s/%s: %w", p.n.Namespace, p.n.ServingSecret, err)
	}
	return err
}

func (p *podTarget) FaultKind(force bool) string {
	if force {
		return "delete-pod-force"
	}
	return "delete-pod"
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

type clusterLocalOptions struct {
	binary, runDir            string
	runnerNodes               int
	secretDelay               time.Duration
	propagation, leaseTTL     time.Duration
	leaseRenew, readyTimeout  time.Duration
	killPhase, killInterval   time.Duration
	timeout                   time.Duration
	chaosArgs                 []string
	deployDir, kubeOvercommit string
}

// runClusterLocal is `chaos cluster` end to end on this machine: the local control plane with
// `kcp pod-runner` as its kubelets, kube-overcommit installed from deploy/ (kustomize output,
// server-side apply) so that its Deployment's pods run as processes of the release binary
// under the manifests' RBAC, then `chaos cluster` run against it through kubectl, with the API
// server's and the replicas' logs read for x509 errors.
func runClusterLocal(args []string) int {
	var o clusterLocalOptions
	fs := pflag.NewFlagSet("chaos cluster-local", pflag.ContinueOnError)
	repo := install.RepoRoot()
	fs.StringVar(&o.binary, "binary", filepath.Join(repo, "target", "release", "kube-overcommit"), "kube-overcommit binary the pods' image maps to")
	fs.StringVar(&o.deployDir, "deploy", filepath.Join(repo, "deploy"), "kustomization to install")
	fs.StringVar(&o.runDir, "run-dir", "", "control plane run directory (default: a new temporary directory, removed unless the run failed)")
	fs.IntVar(&o.runnerNodes, "runner-nodes", 6, "pod-runner nodes (one replica per node: 3 running, and room for terminating ones)")
	fs.DurationVar(&o.secretDelay, "secret-delay", 2*time.Second, "Secret volume propagation delay of the pod runner")
	fs.DurationVar(&o.propagation, "propagation-delay", 8*time.Second, "KUBE_OVERCOMMIT_PROPAGATION_DELAY set on the Deployment (must exceed --secret-delay)")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 6*time.Second, "KUBE_OVERCOMMIT_LEASE_TTL set on the Deployment")
	fs.DurationVar(&o.leaseRenew, "lease-renew", 2*time.Second, "KUBE_OVERCOMMIT_LEASE_RENEW set on the Deployment")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 3*time.Minute, "how long the installation may take to have every replica ready")
	fs.DurationVar(&o.killPhase, "kill-phase", 30*time.Second, "chaos cluster --kill-phase")
	fs.DurationVar(&o.killInterval, "kill-interval", 6*time.Second, "chaos cluster --kill-interval")
	fs.DurationVar(&o.timeout, "timeout", 40*time.Minute, "bound on the whole run (raise it with --chaos-arg=--duration=...)")
	fs.StringArrayVar(&o.chaosArgs, "chaos-arg", nil, "more `chaos cluster` flags (repeatable), e.g. --chaos-arg=--duration=20m")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if _, err := os.Stat(o.binary); err != nil {
		fmt.Fprintf(os.Stderr, "chaos cluster-local: %v (build it: make release)\n", err)
		return 2
	}
	if o.propagation <= o.secretDelay {
		fmt.Fprintln(os.Stderr, "chaos cluster-local: --propagation-delay must exceed --secret-delay")
		return 2
	}
	_, broken, err := clusterLocalRun(o)
	return verdict("cluster-local", broken, err)
}

func clusterLocalRun(o clusterLocalOptions) (code int, broken []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()
	start := time.Now()

	c, stopControlPlane, err := startControlPlane(o.runDir)
	if err != nil {
		return 0, nil, err
	}
	defer func() { broken = append(broken, stopControlPlane(code != 0 || len(broken) > 0 || err != nil)...) }()

	// The kubelets: pods labelled as kube-overcommit's run as processes of the release binary.
	runner, err := c.StartPodRunner(harness.PodRunnerOptions{Count: o.runnerNodes,
		Selector: "app.kubernetes.io/name=kube-overcommit",
		Images:   []string{"*kube-overcommit*=" + o.binary},
		Args:     []string{"--secret-delay=" + o.secretDelay.String()}})
	if err != nil {
		return 0, nil, err
	}
	defer func() {
		progress("stopping the pod runner (and its processes)")
		if err := runner.Stop(); err != nil {
			broken = append(broken, "pod runner: "+err.Error())
		}
	}()

	manifest, err := renderInstall(c, o)
	if err != nil {
		return 0, nil, err
	}
	progress("installing %s (server-side apply of the kustomize output, %s)", o.deployDir, manifest)
	if out, err := c.Kubectl("apply", "--server-side", "--field-manager=chaos-cluster-local", "-f", manifest); err != nil {
		return 0, nil, fmt.Errorf("kubectl apply: %w\n%s", err, out)
	}
	n := defaultNames(install.DefaultNamespace)
	tg := &podTarget{o: clusterOptions{replicas: 3, selector: "app.kubernetes.io/name=kube-overcommit"}, client: c.Client, n: n}
	err = waitFor(ctx, o.readyTimeout, 500*time.Millisecond, "installation ready", func() error {
		if r := tg.Ready(ctx); len(r) < 3 {
			return fmt.Errorf("%d of 3 kube-overcommit pods ready", len(r))
		}
		cfg, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, n.WebhookConfig, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, w := range cfg.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("webhook %s has no caBundle yet", w.Name)
			}
		}
		// What the API server reaches: exactly the ready pods.
		return c.WaitBackendsReady(n.Namespace, install.DefaultService, 3, time.Millisecond)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("%w (logs: %s/logs/pod-kube-overcommit-*.log)", err, c.RunDir)
	}
	progress("installed in %.0fs: 3 replicas ready, the API server's resolver reaches 3 backends", time.Since(start).Seconds())

	kubectl, err := kubectlWrapper(c)
	if err != nil {
		return 0, nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, nil, err
	}
	chaosArgs := append([]string{"cluster", "--kubeconfig=" + c.Kubeconfig, "--context=kcp", "--" + confirmFlag,
		"--kubectl=" + kubectl, "--kill-phase=" + o.killPhase.String(), "--kill-interval=" + o.killInterval.String(),
		"--apiserver-log=" + filepath.Join(c.RunDir, "logs", "apiserver*.log"),
		"--replica-logs=" + filepath.Join(c.RunDir, "logs", "pod-kube-overcommit-*.log")}, o.chaosArgs...)
	progress("running chaos %s", strings.Join(chaosArgs, " "))
	cmd := exec.CommandContext(ctx, self, chaosArgs...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
		broken = append(broken, fmt.Sprintf("chaos cluster exited %d", code))
	default:
		return 0, nil, fmt.Errorf("chaos cluster: %w", err)
	}
	// The replicas ran with the ServiceAccount's token: anything deploy/'s RBAC or its webhook
	// guard refused shows in their logs.
	logs, _ := filepath.Glob(filepath.Join(c.RunDir, "logs", "pod-kube-overcommit-*.log"))
	for _, l := range logs {
		if n, sample := scanNew(l, map[string]int64{}, func(line string) bool { return strings.Contains(line, "forbidden") }); n > 0 {
			broken = append(broken, fmt.Sprintf("%s: %d line(s) naming an authorization refusal, e.g. %s", filepath.Base(l), n, sample))
		}
	}
	progress("%d replica logs read for authorization refusals", len(logs))
	progress("chaos cluster-local took %.0fs in all", time.Since(start).Seconds())
	return code, broken, nil
}

// renderInstall renders the kustomization with the kustomize that kubectl embeds and sets, on
// the Deployment's container, the leader's timings through the environment (a CA rotation
// waits the propagation delay, 120 s by default) and debug logs of the TLS server (so that
// handshakes the API server aborts are seen). Everything else is deploy/ as it is.
func renderInstall(c *harness.Cluster, o clusterLocalOptions) (string, error) {
	out, err := c.Kubectl("kustomize", o.deployDir)
	if err != nil {
		return "", fmt.Errorf("kubectl kustomize %s: %w\n%s", o.deployDir, err, out)
	}
	objs, err := parseManifests(out)
	if err != nil {
		return "", err
	}
	env := map[string]string{
		"KUBE_OVERCOMMIT_PROPAGATION_DELAY": secs(o.propagation),
		"KUBE_OVERCOMMIT_LEASE_TTL":         secs(o.leaseTTL),
		"KUBE_OVERCOMMIT_LEASE_RENEW":       secs(o.leaseRenew),
		"KUBE_OVERCOMMIT_CHECK_INTERVAL":    "1s",
		"RUST_LOG":                          "info,kube_overcommit::server=debug",
	}
	found := false
	for _, obj := range objs {
		if obj.GetKind() != "Deployment" || obj.GetName() != "kube-overcommit" {
			continue
		}
		found = true
		if err := setContainerEnv(obj, env); err != nil {
			return "", err
		}
	}
	if !found {
		return "", fmt.Errorf("%s has no Deployment kube-overcommit", o.deployDir)
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": objs}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.RunDir, "install.json")
	return path, os.WriteFile(path, data, 0o644)
}

func parseManifests(stream string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(stream)), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("kustomize output: %w", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

// setContainerEnv sets env variables (replacing ones of the same name) on every container of a
// Deployment.
func setContainerEnv(d *unstructured.Unstructured, env map[string]string) error {
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) == 0 {
		return fmt.Errorf("deployment %s: no containers (%v)", d.GetName(), err)
	}
	for i, raw := range containers {
		var ctr corev1.Container
		if err := runtimeFromMap(raw, &ctr); err != nil {
			return err
		}
		kept := ctr.Env[:0]
		for _, e := range ctr.Env {
			if _, ok := env[e.Name]; !ok {
				kept = append(kept, e)
			}
		}
		ctr.Env = kept
		for _, k := range sortedKeys(env) {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: k, Value: env[k]})
		}
		m, err := runtimeToMap(&ctr)
		if err != nil {
			return err
		}
		containers[i] = m
	}
	return unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers")
}

func runtimeFromMap(in any, out any) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}

func runtimeToMap(in any) (map[string]any, error) {
	var m map[string]any
	return m, runtimeFromMap(in, &m)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// kubectlWrapper writes <run>/bin/kubectl, which runs the kubectl built into kcp: `chaos
// cluster` deletes pods with a kubectl binary, as an operator would.
func kubectlWrapper(c *harness.Cluster) (string, error) {
	kcp, err := harness.Binary()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.RunDir, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubectl")
	script := fmt.Sprintf("#!/bin/sh\nexec %q kubectl \"$@\"\n", kcp)
	return path, os.WriteFile(path, []byte(script), 0o755)
}

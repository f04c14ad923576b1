// Package harness starts a real local control plane (the kcp binary of tests/cluster) for Go
// tests, or connects to a running one, and offers helpers for fake nodes, webhook backends and
// Secret volumes. The API is documented in tests/cluster/README.md and kept stable.
//
//	c := harness.Start(t, harness.Options{Nodes: 3})
//	pods, _ := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kube-overcommit/tests/cluster/internal/fakenode"
	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/services"
)

// Options of a control plane started by Start or New.
type Options struct {
	// Nodes fake nodes run under the supervisor, named node-0..node-N-1 (prefix "node").
	Nodes int
	// FakeNodeArgs are extra flags of those supervised fake nodes (see `kcp fake-nodes --help`).
	FakeNodeArgs []string
	// APIServerArgs are extra kube-apiserver flags.
	APIServerArgs []string
	// ReadyTimeout bounds the start (default 3 minutes).
	ReadyTimeout time.Duration
	// RunDir is where the control plane lives (default: a new temporary directory).
	RunDir string
}

// Cluster is a running control plane.
type Cluster struct {
	// RunDir is the run directory (see README: layout).
	RunDir string
	// Kubeconfig is the admin kubeconfig path.
	Kubeconfig string
	// Server is the API server URL (https://127.0.0.1:PORT).
	Server string
	// RestConfig and Client are admin clients.
	RestConfig *rest.Config
	Client     kubernetes.Interface
	// External is true when connected to a control plane started elsewhere (KCP_KUBECONFIG);
	// Stop then leaves it running.
	External bool

	bin string
}

// FakeNodeStats is the JSON document a fake-nodes process publishes.
type FakeNodeStats = fakenode.Stats

// Backend is a webhook backend of a Service.
type Backend = services.Backend

// BackendState is a backend as the API server's resolver last saw it.
type BackendState = services.BackendState

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// ModuleDir is the tests/cluster directory (found from this source file).
func ModuleDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Binary builds the kcp binary if needed (tests/cluster/kcp.sh build) and returns its path.
func Binary() (string, error) {
	binOnce.Do(func() {
		cmd := exec.Command(filepath.Join(ModuleDir(), "kcp.sh"), "build")
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if binErr = cmd.Run(); binErr != nil {
			binErr = fmt.Errorf("kcp.sh build: %w", binErr)
			return
		}
		binPath = strings.TrimSpace(out.String())
	})
	return binPath, binErr
}

// Start starts a control plane for the test (or connects to $KCP_KUBECONFIG's) and stops it in
// t.Cleanup, failing the test if any process is left behind.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.RunDir == "" && os.Getenv("KCP_KUBECONFIG") == "" {
		opts.RunDir = t.TempDir()
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(t, 40)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return c
}

// New starts a control plane (or connects to $KCP_KUBECONFIG's); the caller must Stop it.
// For TestMain, where there is no testing.T.
func New(opts Options) (*Cluster, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if kc := os.Getenv("KCP_KUBECONFIG"); kc != "" {
		abs, err := filepath.Abs(kc)
		if err != nil {
			return nil, err
		}
		c := &Cluster{RunDir: filepath.Dir(abs), Kubeconfig: abs, External: true, bin: bin}
		return c, c.connect()
	}
	if opts.RunDir == "" {
		if opts.RunDir, err = os.MkdirTemp("", "kcp-run-"); err != nil {
			return nil, err
		}
	}
	run, err := runfiles.Abs(opts.RunDir)
	if err != nil {
		return nil, err
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	c := &Cluster{RunDir: string(run), Kubeconfig: run.Kubeconfig(), bin: bin}
	// --exit-with-pid: a test binary killed by its -timeout never runs its cleanup; the
	// control plane then stops by itself.
	args := []string{"up", fmt.Sprintf("--nodes=%d", opts.Nodes), "--timeout=" + opts.ReadyTimeout.String(),
		"--fake-node-arg=--prefix=node", fmt.Sprintf("--exit-with-pid=%d", os.Getpid())}
	for _, a := range opts.FakeNodeArgs {
		args = append(args, "--fake-node-arg="+a)
	}
	for _, a := range opts.APIServerArgs {
		args = append(args, "--apiserver-arg="+a)
	}
	if out, err := c.Kcp(args...); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("kcp up: %w\n%s", err, out)
	}
	return c, c.connect()
}

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c.RestConfig, c.Client, c.Server = cfg, cs, cfg.Host
	return nil
}

// Kcp runs a one-shot kcp subcommand (status, restart, backend, kubectl, ...) against this
// control plane and returns its combined output.
func (c *Cluster) Kcp(args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("no kcp subcommand")
	}
	full := append([]string{args[0], "--run-dir=" + c.RunDir}, args[1:]...)
	if args[0] == "kubectl" {
		full = append([]string{"kubectl", "--kubeconfig=" + c.Kubeconfig}, args[1:]...)
	}
	cmd := exec.Command(c.bin, full...)
	cmd.Env = append(os.Environ(), "KCP_RUN_DIR="+c.RunDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Kubectl runs kubectl against this control plane.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	return c.Kcp(append([]string{"kubectl"}, args...)...)
}

// Stop stops every process of the control plane (kcp down) and reports any survivor. A
// connected (External) control plane is left running.
func (c *Cluster) Stop() error {
	if c.External {
		return nil
	}
	out, err := c.Kcp("down")
	if err != nil {
		return fmt.Errorf("kcp down: %w\n%s", err, out)
	}
	if left := c.Processes(); len(left) > 0 {
		return fmt.Errorf("processes left after kcp down: %v", left)
	}
	return nil
}

// Processes lists the live kcp processes of this run directory.
func (c *Cluster) Processes() []runfiles.Proc { return runfiles.Dir(c.RunDir).Processes() }

// Restart stops a component (etcd, apiserver, scheduler, controller-manager, fake-nodes) and
// waits until the supervisor has it back; extra args e.g. "--signal=KILL", "--down-for=5s".
func (c *Cluster) Restart(component string, args ...string) error {
	out, err := c.Kcp(append([]string{"restart", component}, args...)...)
	if err != nil {
		return fmt.Errorf("kcp restart %s: %w\n%s", component, err, out)
	}
	return nil
}

// DumpLogs writes the last lines of every component log to the test log, or of the named ones
// only (e.g. "scheduler", "fake-nodes": <run>/logs/NAME.log).
func (c *Cluster) DumpLogs(t testing.TB, lines int, names ...string) {
	t.Helper()
	var logs []string
	for _, n := range names {
		logs = append(logs, filepath.Join(c.RunDir, "logs", n+".log"))
	}
	if len(names) == 0 {
		logs, _ = filepath.Glob(filepath.Join(c.RunDir, "logs", "*.log"))
	}
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		t.Logf("==> %s <==\n%s", l, strings.Join(all, "\n"))
	}
}

// AddBackend registers a webhook backend for Service namespace/name (see README: services).
func (c *Cluster) AddBackend(namespace, service string, b Backend) error {
	return services.Add(filepath.Join(c.RunDir, "services"), namespace, service, b)
}

// RemoveBackend unregisters the backend with this address (and port, if not 0).
func (c *Cluster) RemoveBackend(namespace, service, addr string, port int32) error {
	return services.Remove(filepath.Join(c.RunDir, "services"), namespace, service, addr, port)
}

// ResolverState is what the API server's resolver last saw of namespace/service.
func (c *Cluster) ResolverState(namespace, service string) ([]BackendState, error) {
	st, err := services.ReadState(filepath.Join(c.RunDir, "services"))
	if err != nil {
		return nil, err
	}
	return st[namespace+"/"+service], nil
}

// WaitBackendsReady waits until the API server's resolver sees exactly n ready backends.
func (c *Cluster) WaitBackendsReady(namespace, service string, n int, timeout time.Duration) error {
	return Eventually(timeout, 100*time.Millisecond, func() error {
		bs, err := c.ResolverState(namespace, service)
		if err != nil {
			return err
		}
		ready := 0
		for _, b := range bs {
			if b.Ready {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%s/%s: %d ready backends, want %d (%v)", namespace, service, ready, n, bs)
		}
		return nil
	})
}

// FakeNodesOptions configures StartFakeNodes.
type FakeNodesOptions struct {
	// Prefix names the nodes <prefix>-<i> (required, unique per process).
	Prefix string
	// Count of nodes (default 1).
	Count int
	// Args are more `kcp fake-nodes` flags, e.g. "--cpu=16", "--images=50",
	// "--status-update-frequency=1s", "--allocatable-cpu=4".
	Args []string
}

// FakeNodes is a running `kcp fake-nodes` (or `kcp pod-runner`) process.
type FakeNodes struct {
	Prefix    string
	Names     []string
	StatsFile string
	cmd       *exec.Cmd
	done      chan struct{}
}

// StartFakeNodes runs a fake-nodes process (a child of the test, killed if the test dies,
// stopped by Stop or by kcp down). Use t.Cleanup(func(){ f.Stop() }) when needed earlier.
func (c *Cluster) StartFakeNodes(opts FakeNodesOptions) (*FakeNodes, error) {
	return c.startNodes("fake-nodes", opts)
}

// PodRunnerOptions configures StartPodRunner.
type PodRunnerOptions struct {
	// Prefix names the nodes <prefix>-<i> (default "runner"); Count of nodes (default 1).
	Prefix string
	Count  int
	// Selector picks the pods run as processes (default: app.kubernetes.io/name=kube-overcommit).
	Selector string
	// Images are PATTERN=BINARY rules (default: *kube-overcommit* = $KUBE_OVERCOMMIT_BIN).
	Images []string
	// Args are more `kcp pod-runner` flags: fake-node flags, "--secret-delay=2s", ...
	Args []string
}

// StartPodRunner runs `kcp pod-runner`: fake nodes whose matching pods run as local processes
// (a child of the caller; its processes die with it). Logs: <run>/logs/pod-runner-<prefix>.log
// and one <run>/logs/pod-<namespace>-<name>.log per pod.
func (c *Cluster) StartPodRunner(opts PodRunnerOptions) (*FakeNodes, error) {
	if opts.Prefix == "" {
		opts.Prefix = "runner"
	}
	args := append([]string{}, opts.Args...)
	if opts.Selector != "" {
		args = append(args, "--selector="+opts.Selector)
	}
	for _, im := range opts.Images {
		args = append(args, "--image="+im)
	}
	return c.startNodes("pod-runner", FakeNodesOptions{Prefix: opts.Prefix, Count: opts.Count, Args: args})
}

func (c *Cluster) startNodes(subcommand string, opts FakeNodesOptions) (*FakeNodes, error) {
	if opts.Prefix == "" {
		return nil, errors.New("FakeNodesOptions.Prefix is required")
	}
	if opts.Count == 0 {
		opts.Count = 1
	}
	run := runfiles.Dir(c.RunDir)
	f := &FakeNodes{Prefix: opts.Prefix, StatsFile: run.Stats(opts.Prefix), done: make(chan struct{})}
	for i := 0; i < opts.Count; i++ {
		f.Names = append(f.Names, fakenode.NodeName(opts.Prefix, i))
	}
	_ = os.Remove(f.StatsFile)
	args := append([]string{subcommand, "--run-dir=" + c.RunDir, "--kubeconfig=" + c.Kubeconfig,
		"--prefix=" + opts.Prefix, fmt.Sprintf("--count=%d", opts.Count)}, opts.Args...)
	cmd, err := c.startChild(filepath.Join(c.RunDir, "logs", subcommand+"-"+opts.Prefix+".log"), args)
	if err != nil {
		return nil, err
	}
	f.cmd = cmd
	go func() { _ = cmd.Wait(); close(f.done) }()
	return f, nil
}

func (c *Cluster) startChild(logPath string, args []string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "KCP_RUN_DIR="+c.RunDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd, cmd.Start()
}

// Stats reads the process's latest published statistics.
func (f *FakeNodes) Stats() (FakeNodeStats, error) { return ReadFakeNodeStats(f.StatsFile) }

// ReadFakeNodeStats reads a fake-nodes stats file (<run dir>/stats/<prefix>.json).
func ReadFakeNodeStats(path string) (FakeNodeStats, error) {
	var s FakeNodeStats
	data, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(data, &s)
}

// Stop sends SIGTERM and waits (10 s, then SIGKILL).
func (f *FakeNodes) Stop() error { return stopCmd(f.cmd, f.done) }

// Kill sends SIGKILL (a crashed kubelet) and waits.
func (f *FakeNodes) Kill() {
	_ = f.cmd.Process.Kill()
	<-f.done
}

// PID of the process.
func (f *FakeNodes) PID() int { return f.cmd.Process.Pid }

func stopCmd(cmd *exec.Cmd, done chan struct{}) error {
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("pid %d did not stop on SIGTERM within 10s", cmd.Process.Pid)
	}
}

// HollowNodesOptions configures StartHollowNodes.
type HollowNodesOptions struct {
	// Prefix names the nodes <prefix>-<i> (default "hollow"); Count of nodes (default 1).
	Prefix string
	Count  int
	// Args are more `kcp hollow-nodes` flags: "--cpu=4", "--memory=8Gi", "--pods=110",
	// "--labels=k=v", "--status-update-frequency=10s", "--status-report-frequency=5m",
	// "--lease-duration=40s", "--v=2".
	Args []string
}

// HollowNodes is a running `kcp hollow-nodes`: Kubernetes' own kubelet (kubemark's hollow
// kubelet with a fake runtime), one child process per node. Nothing may connect to a hollow
// node: they report no address, carry the label hollownode.Label, and the harness's
// metrics-server skips them (README: "Hollow nodes").
type HollowNodes struct {
	Prefix string
	Names  []string
	cmd    *exec.Cmd
	done   chan struct{}
	client kubernetes.Interface
}

// StartHollowNodes runs `kcp hollow-nodes` (a child of the test, killed with it; its kubelets
// die with it; stopped by Stop or by kcp down). Logs: <run>/logs/hollow-nodes-<prefix>.log and
// one <run>/logs/hollow-node-<name>.log per kubelet. Use WaitReady before relying on them.
func (c *Cluster) StartHollowNodes(opts HollowNodesOptions) (*HollowNodes, error) {
	if opts.Prefix == "" {
		opts.Prefix = "hollow"
	}
	if opts.Count == 0 {
		opts.Count = 1
	}
	h := &HollowNodes{Prefix: opts.Prefix, done: make(chan struct{}), client: c.Client}
	for i := 0; i < opts.Count; i++ {
		h.Names = append(h.Names, fakenode.NodeName(opts.Prefix, i))
	}
	args := append([]string{"hollow-nodes", "--run-dir=" + c.RunDir, "--kubeconfig=" + c.Kubeconfig,
		"--prefix=" + opts.Prefix, fmt.Sprintf("--count=%d", opts.Count)}, opts.Args...)
	cmd, err := c.startChild(filepath.Join(c.RunDir, "logs", "hollow-nodes-"+opts.Prefix+".log"), args)
	if err != nil {
		return nil, err
	}
	h.cmd = cmd
	go func() { _ = cmd.Wait(); close(h.done) }()
	return h, nil
}

// WaitReady waits until every node is registered with condition Ready True and has its Lease.
func (h *HollowNodes) WaitReady(ctx context.Context, timeout time.Duration) error {
	return Eventually(timeout, 200*time.Millisecond, func() error {
		select {
		case <-h.done:
			return errors.New("kcp hollow-nodes exited")
		default:
		}
		for _, n := range h.Names {
			node, err := h.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(node) {
				return fmt.Errorf("node %s not Ready", n)
			}
			if _, err := h.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Stop sends SIGTERM (each kubelet gets one) and waits (10 s, then SIGKILL). The Node and
// Lease objects stay, as after a stopped kubelet.
func (h *HollowNodes) Stop() error { return stopCmd(h.cmd, h.done) }

// Kill sends SIGKILL to the group; its kubelets die with it (Pdeathsig).
func (h *HollowNodes) Kill() {
	_ = h.cmd.Process.Kill()
	<-h.done
}

// PID of the kcp hollow-nodes process.
func (h *HollowNodes) PID() int { return h.cmd.Process.Pid }

// SecretVolume is a running `kcp secret-volume` process.
type SecretVolume struct {
	Dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartSecretVolume mirrors Secret namespace/name into dir like the kubelet's secret volume,
// applying each change after delay.
func (c *Cluster) StartSecretVolume(namespace, name, dir string, delay time.Duration) (*SecretVolume, error) {
	args := []string{"secret-volume", "--run-dir=" + c.RunDir, "--kubeconfig=" + c.Kubeconfig,
		"--namespace=" + namespace, "--name=" + name, "--dir=" + dir, "--delay=" + delay.String()}
	cmd, err := c.startChild(filepath.Join(c.RunDir, "logs", "secret-volume-"+namespace+"-"+name+".log"), args)
	if err != nil {
		return nil, err
	}
	s := &SecretVolume{Dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	return s, nil
}

// Stop sends SIGTERM and waits.
func (s *SecretVolume) Stop() error { return stopCmd(s.cmd, s.done) }

// PID of the process.
func (s *SecretVolume) PID() int { return s.cmd.Process.Pid }

// MetricsServer is a running `kcp metrics-server` process: the real metrics-server, registered
// as APIService v1beta1.metrics.k8s.io on this control plane's aggregator.
type MetricsServer struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartMetricsServer runs `kcp metrics-server` (a child of the test; log in
// <run>/logs/metrics-server.log). It scrapes the fake nodes started with
// "--resource-metrics" every 10 s; args are more metrics-server flags.
func (c *Cluster) StartMetricsServer(args ...string) (*MetricsServer, error) {
	cmd, err := c.startChild(filepath.Join(c.RunDir, "logs", "metrics-server.log"),
		append([]string{"metrics-server", "--run-dir=" + c.RunDir}, args...))
	if err != nil {
		return nil, err
	}
	m := &MetricsServer{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(m.done) }()
	return m, nil
}

// Stop sends SIGTERM and waits (10 s, then SIGKILL).
func (m *MetricsServer) Stop() error { return stopCmd(m.cmd, m.done) }

// Kill sends SIGKILL and waits.
func (m *MetricsServer) Kill() {
	_ = m.cmd.Process.Kill()
	<-m.done
}

// PID of the process.
func (m *MetricsServer) PID() int { return m.cmd.Process.Pid }

// Eventually polls f every interval until it returns nil or timeout passes, returning the last
// error. Tests wait on conditions with it rather than sleeping.
func Eventually(timeout, interval time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(interval)
	}
}

// Context returns a context that ends with the test (or after timeout).
func Context(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

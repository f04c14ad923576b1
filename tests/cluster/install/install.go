// Package install runs a local installation of kube-overcommit on a harness control plane, the
// way its Deployment runs in a cluster: N replicas of the real binary as processes, each with
// its own 127.0.0.1 webhook and probe ports, POD_NAME / POD_NAMESPACE / KUBECONFIG in its
// environment, its serving Secret mirrored into its own tls directory by `kcp secret-volume`
// (the kubelet's ..data swap, with an optional delay), and registered as a backend of the
// Service through the harness's resolver, which sends the API server only to ready replicas.
//
//	in, err := install.Install(ctx, cluster, install.Options{Replicas: 3, CRD: install.DefaultCRD()})
//	defer in.Stop()
//	err = in.WaitBootstrapped(ctx, 2*time.Minute)   // the leader made certificates and the webhook configuration
//	leader := in.Leader(ctx)                        // the replica holding the Lease (nil if none of ours)
//	leader.Restart(syscall.SIGKILL)                 // a crashed container, restarted in the same pod
//
// With Options.Replace, a replica that exits is replaced as a Deployment replaces a pod: after
// RestartDelay, with a new identity (generation), the same ports and tls directory.
//
// Every process is started with Pdeathsig=SIGKILL from one locked OS thread, so nothing outlives
// the Go process that started it; Stop ends them in order (SIGTERM, grace, SIGKILL) and unregisters
// the backends.
package install

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/spawn"
)

// Defaults match the binary's own flag defaults and deploy/.
const (
	DefaultNamespace     = "kube-overcommit"
	DefaultService       = "kube-overcommit"
	DefaultServingSecret = "kube-overcommit-tls"
	DefaultCASecret      = "kube-overcommit-ca"
	DefaultLease         = "kube-overcommit-leader"
	DefaultWebhookConfig = "kube-overcommit"
	CRDName              = "overcommitpolicies.overcommit.dev"
)

// Options of an installation. Zero values take the defaults above.
type Options struct {
	// Namespace of the installation (created if missing): POD_NAMESPACE of every replica.
	Namespace string
	// Service the API server calls (the MutatingWebhookConfiguration's clientConfig.service);
	// ServicePort its port (443).
	Service     string
	ServicePort int32
	// ServingSecret is mirrored into each replica's tls directory; CASecret holds the CA (the
	// leader's, never mounted: WaitBootstrapped waits for it).
	ServingSecret string
	CASecret      string
	// LeaseName is the leader Lease (for Leader); WebhookConfig the configuration Uninstall deletes.
	LeaseName     string
	WebhookConfig string
	// Replicas to start (default 3).
	Replicas int
	// Binary of kube-overcommit (default: Binary()).
	Binary string
	// Args are more `serve` flags (after --listen, --probe-listen, --tls-dir).
	Args []string
	// Env are more environment variables (KEY=VALUE); RUST_LOG defaults to info.
	Env []string
	// SecretDelay is the Secret volume's propagation delay (kcp secret-volume --delay).
	SecretDelay time.Duration
	// Dir holds the replicas' tls directories (default <run dir>/install/<namespace>).
	Dir string
	// CRD is a manifest applied (server-side) before the replicas start, then waited on until
	// Established; empty: none (DefaultCRD() is the repository's).
	CRD string
	// Identity names a replica (POD_NAME) from its index and generation (1, 2, ... as it is
	// replaced). Default: <namespace>-<index>, then <namespace>-<index>-g<generation>.
	Identity func(index, generation int) string
	// Replace exited replicas like a Deployment does, after RestartDelay (default 1 s).
	Replace      bool
	RestartDelay time.Duration
	// StopGrace bounds each SIGTERM before SIGKILL (default 30 s).
	StopGrace time.Duration
}

func (o *Options) defaults(c *harness.Cluster) error {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Service == "" {
		o.Service = DefaultService
	}
	if o.ServicePort == 0 {
		o.ServicePort = 443
	}
	if o.ServingSecret == "" {
		o.ServingSecret = DefaultServingSecret
	}
	if o.CASecret == "" {
		o.CASecret = DefaultCASecret
	}
	if o.LeaseName == "" {
		o.LeaseName = DefaultLease
	}
	if o.WebhookConfig == "" {
		o.WebhookConfig = DefaultWebhookConfig
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Binary == "" {
		b, err := Binary()
		if err != nil {
			return err
		}
		o.Binary = b
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(c.RunDir, "install", o.Namespace)
	}
	if o.Identity == nil {
		ns := o.Namespace
		o.Identity = func(i, gen int) string {
			if gen <= 1 {
				return fmt.Sprintf("%s-%d", ns, i)
			}
			return fmt.Sprintf("%s-%d-g%d", ns, i, gen)
		}
	}
	if o.RestartDelay == 0 {
		o.RestartDelay = time.Second
	}
	if o.StopGrace == 0 {
		o.StopGrace = 30 * time.Second
	}
	return nil
}

// RepoRoot is the repository (two levels above tests/cluster).
func RepoRoot() string { return filepath.Dir(filepath.Dir(harness.ModuleDir())) }

// DefaultCRD is the OvercommitPolicy CRD checked in under deploy/.
func DefaultCRD() string {
	return filepath.Join(RepoRoot(), "deploy", "crd", "overcommitpolicies.yaml")
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary is $KUBE_OVERCOMMIT_BIN, else target/release/kube-overcommit, built by
// `cargo build --release --locked` (cargo's progress on stderr) once per process.
func Binary() (string, error) {
	binOnce.Do(func() {
		if p := os.Getenv("KUBE_OVERCOMMIT_BIN"); p != "" {
			binPath, binErr = filepath.Abs(p)
			if binErr == nil {
				_, binErr = os.Stat(binPath)
			}
			return
		}
		root := RepoRoot()
		cmd := exec.Command("cargo", "build", "--release", "--locked")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			binErr = fmt.Errorf("cargo build --release --locked: %w", err)
			return
		}
		binPath = filepath.Join(root, "target", "release", "kube-overcommit")
	})
	return binPath, binErr
}

// Installation is a running local installation.
type Installation struct {
	Options
	cluster *harness.Cluster

	mu       sync.Mutex
	replicas []*Replica
	stopping bool
	wg       sync.WaitGroup
}

// Replica is one replica "pod": fixed ports, tls directory and log; its process comes and goes.
type Replica struct {
	Index int
	// Listen and Probe are 127.0.0.1:PORT of the webhook (HTTPS) and probe (HTTP) servers.
	Listen, Probe string
	// TLSDir is where the serving Secret is mirrored; LogPath collects every process's output.
	TLSDir, LogPath string
	Volume          *harness.SecretVolume

	in         *Installation
	mu         sync.Mutex
	generation int
	identity   string
	cmd        *exec.Cmd
	done       chan struct{}
	held       bool // an exit that must not be replaced (Stop, Restart)
	starts     int
	exits      int
	lastExit   string
}

// Install creates the namespace, applies the CRD, and starts the replicas (not waiting for
// readiness: see WaitReady, WaitBootstrapped). On error, whatever was started is stopped.
func Install(ctx context.Context, c *harness.Cluster, o Options) (*Installation, error) {
	if err := o.defaults(c); err != nil {
		return nil, err
	}
	in := &Installation{Options: o, cluster: c}
	if err := in.createNamespace(ctx); err != nil {
		return nil, err
	}
	if o.CRD != "" {
		if err := ApplyCRD(c, o.CRD); err != nil {
			return nil, err
		}
	}
	for i := 0; i < o.Replicas; i++ {
		if _, err := in.AddReplica(); err != nil {
			_ = in.Stop()
			return nil, err
		}
	}
	return in, nil
}

func (in *Installation) createNamespace(ctx context.Context) error {
	_, err := in.cluster.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: in.Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", in.Namespace, err)
	}
	return nil
}

// ApplyCRD applies a CRD manifest (server-side, as an operator would) and waits until it is
// Established, so that policies can be created and watched right after.
func ApplyCRD(c *harness.Cluster, path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("CRD manifest: %w", err)
	}
	if out, err := c.Kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=kube-overcommit-install", "-f", path); err != nil {
		return fmt.Errorf("kubectl apply -f %s: %w\n%s", path, err, out)
	}
	if out, err := c.Kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/"+CRDName); err != nil {
		return fmt.Errorf("CRD %s not established: %w\n%s", CRDName, err, out)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// AddReplica adds one more replica (a scale-up): ports, Secret volume, backend, process.
func (in *Installation) AddReplica() (*Replica, error) {
	in.mu.Lock()
	i := len(in.replicas)
	in.mu.Unlock()
	wp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(in.Dir, fmt.Sprintf("replica-%d", i))
	// The mount point exists before the container starts, as with a kubelet volume.
	if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o755); err != nil {
		return nil, err
	}
	r := &Replica{Index: i, in: in,
		Listen:  fmt.Sprintf("127.0.0.1:%d", wp),
		Probe:   fmt.Sprintf("127.0.0.1:%d", pp),
		TLSDir:  filepath.Join(dir, "tls"),
		LogPath: filepath.Join(in.cluster.RunDir, "logs", fmt.Sprintf("%s-replica-%d.log", in.Namespace, i)),
	}
	if err := os.MkdirAll(filepath.Dir(r.LogPath), 0o755); err != nil {
		return nil, err
	}
	r.Volume, err = in.cluster.StartSecretVolume(in.Namespace, in.ServingSecret, r.TLSDir, in.SecretDelay)
	if err != nil {
		return nil, fmt.Errorf("secret volume of replica %d: %w", i, err)
	}
	in.mu.Lock()
	in.replicas = append(in.replicas, r)
	in.mu.Unlock()
	if err := in.cluster.AddBackend(in.Namespace, in.Service, harness.Backend{Addr: r.Listen, Port: in.ServicePort,
		ReadyURL: "http://" + r.Probe + "/readyz"}); err != nil {
		return nil, fmt.Errorf("register backend of replica %d: %w", i, err)
	}
	r.mu.Lock()
	r.generation = 1
	r.mu.Unlock()
	if err := r.Start(); err != nil {
		return nil, err
	}
	return r, nil
}

// Replicas in index order.
func (in *Installation) Replicas() []*Replica {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]*Replica(nil), in.replicas...)
}

// Replica by index (nil if out of range).
func (in *Installation) Replica(i int) *Replica {
	in.mu.Lock()
	defer in.mu.Unlock()
	if i < 0 || i >= len(in.replicas) {
		return nil
	}
	return in.replicas[i]
}

// ByIdentity finds the replica whose current process has this identity.
func (in *Installation) ByIdentity(id string) *Replica {
	for _, r := range in.Replicas() {
		if r.Identity() == id {
			return r
		}
	}
	return nil
}

// LeaderIdentity is the holder of the leader Lease ("" if none or unreadable).
func (in *Installation) LeaderIdentity(ctx context.Context) string {
	l, err := in.cluster.Client.CoordinationV1().Leases(in.Namespace).Get(ctx, in.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// Leader is the replica holding the Lease, nil if no current process of ours holds it.
func (in *Installation) Leader(ctx context.Context) *Replica {
	id := in.LeaderIdentity(ctx)
	if id == "" {
		return nil
	}
	return in.ByIdentity(id)
}

// ReadyReplicas are the replicas whose /readyz answers 200, in index order.
func (in *Installation) ReadyReplicas() []*Replica {
	var out []*Replica
	for _, r := range in.Replicas() {
		if r.Ready() {
			out = append(out, r)
		}
	}
	return out
}

// WaitReady waits until n replicas answer /readyz and the API server's resolver sees n ready
// backends of the Service.
func (in *Installation) WaitReady(n int, timeout time.Duration) error {
	err := harness.Eventually(timeout, 200*time.Millisecond, func() error {
		if r := in.ReadyReplicas(); len(r) < n {
			return fmt.Errorf("%d of %d replicas ready", len(r), n)
		}
		return in.cluster.WaitBackendsReady(in.Namespace, in.Service, n, time.Millisecond)
	})
	if err != nil {
		return fmt.Errorf("%w (replica logs: %s)", err, strings.Join(in.LogPaths(), " "))
	}
	return nil
}

// WaitBootstrapped waits for what the leader sets up on an empty cluster: the serving and CA
// Secrets, the MutatingWebhookConfiguration with a caBundle, a Lease holder, and every replica
// ready (which needs its certificate to chain to the caBundle).
func (in *Installation) WaitBootstrapped(ctx context.Context, timeout time.Duration) error {
	start := time.Now()
	cs := in.cluster.Client
	err := harness.Eventually(timeout, 250*time.Millisecond, func() error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, s := range []string{in.ServingSecret, in.CASecret} {
			if _, err := cs.CoreV1().Secrets(in.Namespace).Get(ctx, s, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("secret %s: %w", s, err)
			}
		}
		cfg, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, in.WebhookConfig, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("webhook configuration: %w", err)
		}
		if len(cfg.Webhooks) == 0 || len(cfg.Webhooks[0].ClientConfig.CABundle) == 0 {
			return errors.New("webhook configuration without a caBundle")
		}
		if in.LeaderIdentity(ctx) == "" {
			return errors.New("no Lease holder")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("bootstrap: %w (replica logs: %s)", err, strings.Join(in.LogPaths(), " "))
	}
	rest := timeout - time.Since(start)
	if rest < time.Second {
		rest = time.Second
	}
	return in.WaitReady(len(in.Replicas()), rest)
}

// LogPaths of every replica.
func (in *Installation) LogPaths() []string {
	var out []string
	for _, r := range in.Replicas() {
		out = append(out, r.LogPath)
	}
	return out
}

// Summary: starts, exits and the last exit of every replica.
func (in *Installation) Summary() string {
	var parts []string
	for _, r := range in.Replicas() {
		r.mu.Lock()
		parts = append(parts, fmt.Sprintf("replica %d (%s): %d starts, %d exits (last: %s)", r.Index, r.identity, r.starts, r.exits, r.lastExit))
		r.mu.Unlock()
	}
	return strings.Join(parts, "; ")
}

// Stop ends every replica (SIGTERM; SIGKILL after StopGrace), then the Secret volumes, and
// unregisters the backends. What the leader wrote to the API server stays (see Uninstall).
func (in *Installation) Stop() error {
	in.mu.Lock()
	in.stopping = true
	replicas := append([]*Replica(nil), in.replicas...)
	in.mu.Unlock()
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Stop(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	in.wg.Wait()
	for _, r := range replicas {
		if r.Volume != nil {
			if err := r.Volume.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := in.cluster.RemoveBackend(in.Namespace, in.Service, r.Listen, 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Uninstall stops the replicas and removes the webhook configurations they kept in place, so
// the API server stops calling a Service without backends (it would fail open, but slowly
// and noisily); with deleteNamespace also the namespace (Secrets, Leases).
func (in *Installation) Uninstall(ctx context.Context, deleteNamespace bool) error {
	errs := []error{in.Stop()}
	cs := in.cluster.Client
	if err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, in.WebhookConfig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	// The placement cap's, kept by a leader run with --request-cap (same name).
	if err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, in.WebhookConfig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	if deleteNamespace {
		if err := cs.CoreV1().Namespaces().Delete(ctx, in.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Identity of the current (or last) process: its POD_NAME and Lease identity.
func (r *Replica) Identity() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.identity
}

// Generation counts replacements (1 for the first process of the replica).
func (r *Replica) Generation() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.generation
}

// Starts and Exits count processes started and ended.
func (r *Replica) Starts() int { r.mu.Lock(); defer r.mu.Unlock(); return r.starts }
func (r *Replica) Exits() int  { r.mu.Lock(); defer r.mu.Unlock(); return r.exits }

// PID of the current process (0 if none is running).
func (r *Replica) PID() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || !r.aliveLocked() {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Replica) aliveLocked() bool {
	if r.done == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Alive: a process of this replica is running.
func (r *Replica) Alive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.aliveLocked()
}

// Done is closed when the current process exits.
func (r *Replica) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// Ready: the probe port answers /readyz with 200.
func (r *Replica) Ready() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + r.Probe + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Start runs a process for the replica if none runs, with the current identity (a container
// restart keeps the pod's name).
func (r *Replica) Start() error {
	in := r.in
	in.mu.Lock()
	stopping := in.stopping
	in.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if stopping {
		return errors.New("installation is stopping")
	}
	if r.aliveLocked() {
		return fmt.Errorf("replica %d already runs (%s)", r.Index, r.identity)
	}
	r.identity = in.Identity(r.Index, r.generation)
	logf, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- install: starting %s (replica %d, generation %d) at %s\n", r.identity, r.Index, r.generation, time.Now().UTC().Format(time.RFC3339Nano))
	args := append([]string{"serve", "--listen=" + r.Listen, "--probe-listen=" + r.Probe, "--tls-dir=" + r.TLSDir}, in.Args...)
	cmd := exec.Command(in.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	env := append(os.Environ(), "RUST_LOG=info,kube_client=warn,kube_runtime=warn,kube_leader_election=warn")
	env = append(env, in.Env...)
	cmd.Env = append(env, "KUBECONFIG="+in.cluster.Kubeconfig, "POD_NAME="+r.identity, "POD_NAMESPACE="+in.Namespace)
	// Own process group: a Ctrl-C in the terminal reaches the Go process, which stops the
	// replicas in order, not the replicas directly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := spawn.Start(cmd); err != nil {
		return fmt.Errorf("start %s: %w", in.Binary, err)
	}
	r.cmd, r.done, r.held = cmd, make(chan struct{}), false
	r.starts++
	done := r.done
	in.wg.Add(1)
	go r.wait(cmd, done)
	return nil
}

func (r *Replica) wait(cmd *exec.Cmd, done chan struct{}) {
	in := r.in
	defer in.wg.Done()
	err := cmd.Wait()
	r.mu.Lock()
	r.exits++
	r.lastExit = fmt.Sprintf("%s: %v", r.identity, exitText(err))
	replace := in.Replace && !r.held
	r.mu.Unlock()
	close(done)
	in.mu.Lock()
	replace = replace && !in.stopping
	in.mu.Unlock()
	if !replace {
		return
	}
	// A Deployment's replacement pod: a new name after a short while.
	time.Sleep(in.RestartDelay)
	r.mu.Lock()
	if r.held || r.aliveLocked() {
		r.mu.Unlock()
		return
	}
	r.generation++
	r.mu.Unlock()
	if err := r.Start(); err != nil && !strings.Contains(err.Error(), "stopping") {
		fmt.Fprintf(os.Stderr, "install: replace replica %d: %v\n", r.Index, err)
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// Signal sends sig to the current process and waits up to timeout for it to exit (with
// Replace on, its replacement then starts by itself). It returns the identity signalled.
func (r *Replica) Signal(sig syscall.Signal, timeout time.Duration) (string, error) {
	r.mu.Lock()
	cmd, done, id, alive := r.cmd, r.done, r.identity, r.aliveLocked()
	r.mu.Unlock()
	if !alive {
		return id, fmt.Errorf("replica %d not running", r.Index)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return id, err
	}
	select {
	case <-done:
		return id, nil
	case <-time.After(timeout):
		return id, fmt.Errorf("%s did not exit within %v of %v", id, timeout, sig)
	}
}

// Send sends sig to the current process without waiting (SIGSTOP / SIGCONT: a hung process).
func (r *Replica) Send(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, alive := r.cmd, r.aliveLocked()
	r.mu.Unlock()
	if !alive {
		return fmt.Errorf("replica %d not running", r.Index)
	}
	return cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (a crashed container) and waits.
func (r *Replica) Kill() error {
	_, err := r.Signal(syscall.SIGKILL, 10*time.Second)
	return err
}

// Stop ends the process for good (no replacement): SIGTERM, SIGKILL after StopGrace.
func (r *Replica) Stop() error {
	r.mu.Lock()
	r.held = true
	alive := r.aliveLocked()
	r.mu.Unlock()
	if !alive {
		return nil
	}
	_, err := r.Signal(syscall.SIGTERM, r.in.StopGrace)
	if err != nil {
		_ = r.Kill()
		return err
	}
	return nil
}

// Restart stops the process with sig (SIGTERM: waiting for its ordered shutdown; SIGKILL: a
// crash) and starts it again with the same identity, as the kubelet restarts a container.
func (r *Replica) Restart(sig syscall.Signal) error {
	r.mu.Lock()
	r.held = true
	alive := r.aliveLocked()
	r.mu.Unlock()
	if alive {
		if _, err := r.Signal(sig, r.in.StopGrace); err != nil {
			_ = r.Kill()
			return err
		}
	}
	return r.Start()
}

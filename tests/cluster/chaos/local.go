package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

type localOptions struct {
	binary          string
	duration        time.Duration
	replicas        int
	nodes           int
	statusEvery     time.Duration
	killPhase       time.Duration
	killInterval    time.Duration
	secretDelay     time.Duration
	webhookTimeout  int
	leafValidity    time.Duration
	propagation     time.Duration
	leaseTTL        time.Duration
	leaseRenew      time.Duration
	runDir          string
	skip            []string
	apiserverSignal string
}

func runLocal(args []string) int {
	var o localOptions
	fs := pflag.NewFlagSet("chaos local", pflag.ContinueOnError)
	repo := filepath.Dir(filepath.Dir(harness.ModuleDir()))
	fs.StringVar(&o.binary, "binary", filepath.Join(repo, "target", "release", "kube-overcommit"), "kube-overcommit binary")
	fs.DurationVar(&o.duration, "duration", 0, "run fault cycles until this much time has passed (0: one cycle, ~2-3 min)")
	fs.IntVar(&o.replicas, "replicas", 3, "webhook replicas")
	fs.IntVar(&o.nodes, "nodes", 10, "fake nodes writing status")
	fs.DurationVar(&o.statusEvery, "status-update-frequency", time.Second, "fake kubelets' nodeStatusUpdateFrequency (and report frequency x3)")
	fs.DurationVar(&o.killPhase, "kill-phase", 25*time.Second, "length of each of the SIGTERM and SIGKILL phases")
	fs.DurationVar(&o.killInterval, "kill-interval", 4*time.Second, "time between two kills")
	fs.DurationVar(&o.secretDelay, "secret-delay", 2*time.Second, "Secret volume propagation delay (kcp secret-volume --delay)")
	fs.IntVar(&o.webhookTimeout, "webhook-timeout", 2, "webhook timeoutSeconds (writes slower than this are counted)")
	fs.DurationVar(&o.leafValidity, "leaf-validity", 90*time.Second, "serving leaf lifetime (rotated at 2/3)")
	fs.DurationVar(&o.propagation, "propagation-delay", 6*time.Second, "CA rotation propagation delay")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 6*time.Second, "leader Lease TTL")
	fs.DurationVar(&o.leaseRenew, "lease-renew", 2*time.Second, "leader Lease renew period")
	fs.StringVar(&o.apiserverSignal, "apiserver-signal", "KILL", "how the API server is stopped for its restart: KILL, TERM, or alternate (by cycle)")
	fs.StringVar(&o.runDir, "run-dir", "", "control plane run directory (default: a new temporary directory, removed at the end)")
	fs.StringSliceVar(&o.skip, "skip", nil, "fault phases to leave out: sigterm,sigkill,sigstop,rotation,certfiles,deletions,apiserver")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if o.replicas < 3 {
		fmt.Fprintln(os.Stderr, "chaos local: --replicas must be at least 3 (SIGTERM kills must leave 2 serving)")
		return 2
	}
	if _, err := os.Stat(o.binary); err != nil {
		fmt.Fprintf(os.Stderr, "chaos local: %v (build it: make release)\n", err)
		return 2
	}
	broken, err := localRun(o)
	return verdict("local", broken, err)
}

const policyYAML = `apiVersion: overcommit.dev/v1alpha1
kind: OvercommitPolicy
metadata:
  name: chaos
spec:
  nodeSelector:
    matchLabels:
      overcommit.dev/chaos: "true"
  priority: 10
  nodeRatios:
    cpu: "2"
  requestCap:
    cpu: "300%"
`

func localRun(o localOptions) (broken []string, err error) {
	// Everything is bounded: the fault cycles, then at most a few minutes of setup and cleanup.
	budget := o.duration
	if budget == 0 {
		budget = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget+8*time.Minute)
	defer cancel()
	ctx, stopSignals := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stopSignals()

	t := newTally()
	c, stopControlPlane, err := startControlPlane(o.runDir)
	if err != nil {
		return nil, err
	}
	defer func() { broken = append(broken, stopControlPlane(len(broken) > 0 || err != nil)...) }()
	o.runDir = c.RunDir

	n := defaultNames("kube-overcommit")
	client := c.Client
	for _, ns := range []string{n.Namespace, "chaos"} {
		_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	policy := filepath.Join(o.runDir, "chaos", "policy.yaml")
	if err := os.MkdirAll(filepath.Dir(policy), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(policy, []byte(policyYAML), 0o644); err != nil {
		return nil, err
	}

	// The replicas: a local installation (package install) whose exited replicas are replaced
	// as a Deployment replaces pods: a new identity, the same ports and Secret volume.
	rs, err := install.Install(ctx, c, install.Options{
		Namespace:     n.Namespace,
		ServingSecret: n.ServingSecret,
		WebhookConfig: n.WebhookConfig,
		Replicas:      o.replicas,
		Binary:        o.binary,
		SecretDelay:   o.secretDelay,
		Replace:       true,
		RestartDelay:  time.Second,
		StopGrace:     15 * time.Second,
		Args:          []string{"--policy-file=" + policy, "--request-cap", "--shutdown-delay=2s", "--shutdown-grace=10s", "--cert-reload-interval=2s"},
		// Leader settings go through the environment so that a flag a binary does not know
		// cannot stop it from starting.
		Env: []string{
			"RUST_LOG=info,kube_overcommit::server=debug",
			"KUBE_OVERCOMMIT_LEAF_VALIDITY=" + secs(o.leafValidity),
			"KUBE_OVERCOMMIT_CA_VALIDITY=3600s",
			"KUBE_OVERCOMMIT_CHECK_INTERVAL=1s",
			"KUBE_OVERCOMMIT_PROPAGATION_DELAY=" + secs(o.propagation),
			"KUBE_OVERCOMMIT_LEASE_TTL=" + secs(o.leaseTTL),
			"KUBE_OVERCOMMIT_LEASE_RENEW=" + secs(o.leaseRenew),
			"KUBE_OVERCOMMIT_WEBHOOK_TIMEOUT_SECONDS=" + strconv.Itoa(o.webhookTimeout),
			// Quiet heartbeats on: the invariants hold with them too.
			"KUBE_OVERCOMMIT_HEARTBEAT_REFRESH=5m",
		},
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		progress("stopping replicas and secret volumes: %s", rs.Summary())
		if err := rs.Stop(); err != nil {
			progress("stop replicas: %v", err)
		}
	}()
	tg := &localTarget{rs: rs, client: client, n: n, binary: o.binary, kubeconfig: c.Kubeconfig}
	sc := &scenario{t: t, tg: tg, client: client, n: n, settle: 60 * time.Second,
		rotationTimeout: 4*o.propagation + 4*o.secretDelay + 30*time.Second}

	progress("waiting for bootstrap: secrets, webhook configuration, %d ready replicas", o.replicas)
	err = waitFor(ctx, 120*time.Second, 500*time.Millisecond, "bootstrap", func() error {
		if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, n.WebhookConfig, metav1.GetOptions{}); err != nil {
			return err
		}
		if r := rs.ReadyReplicas(); len(r) < o.replicas {
			return fmt.Errorf("%d of %d replicas ready", len(r), o.replicas)
		}
		return c.WaitBackendsReady(n.Namespace, "kube-overcommit", o.replicas, time.Millisecond)
	})
	if err != nil {
		return nil, fmt.Errorf("%w (replica logs: %s)", err, strings.Join(rs.LogPaths(), " "))
	}

	// Load and observers.
	fakeNodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "chaos", Count: o.nodes, Args: []string{
		"--cpu=8", "--allocatable-cpu=7", "--images=50", "--labels=overcommit.dev/chaos=true",
		"--status-update-frequency=" + o.statusEvery.String(), "--status-report-frequency=" + (3 * o.statusEvery).String(),
		"--slow-threshold=" + secs(time.Duration(o.webhookTimeout)*time.Second), "--lease-duration=40s"}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = fakeNodes.Stop() }()
	// The placement cap (--request-cap, requestCap 300% of raw cpu 7): in the path before the
	// load starts.
	capStart := time.Now()
	capMsg, err := capAnswers(ctx, client, "chaos", fakeNodes.Names[0])
	if err != nil {
		return nil, fmt.Errorf("%w (replica logs: %s)", err, strings.Join(rs.LogPaths(), " "))
	}
	progress("cap webhook in place (waited %v): a dry-run pod over the cap was refused: %s",
		time.Since(capStart).Round(time.Millisecond), capMsg)
	t.placements = true
	obsCtx, stopObservers := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(6)
	go pollFakeNodeStats(obsCtx, &wg, t, fakeNodes.StatsFile)
	go scrapeAPIServerMetrics(obsCtx, &wg, t, client, webhookNameSuffix)
	go tailLogs(obsCtx, &wg, t, func() []string {
		l, _ := filepath.Glob(filepath.Join(o.runDir, "logs", "apiserver*.log"))
		return l
	}, x509InAPIServerLog, func(p *Phase, k int64) { p.X509APIServer += k }, "x509 in the API server log")
	go tailLogs(obsCtx, &wg, t, rs.LogPaths, x509InReplicaLog, func(p *Phase, k int64) { p.X509Replica += k }, "TLS alert in a replica log")
	go createPods(obsCtx, &wg, t, client, "chaos", 300*time.Millisecond, 40,
		map[string]string{"overcommit.dev/chaos": "true"}, nil)
	go placePods(obsCtx, &wg, t, client, "chaos", fakeNodes.Names, 500*time.Millisecond, 40)
	stopLoad := func() {
		stopObservers()
		wg.Wait()
	}
	defer stopLoad()

	err = waitFor(ctx, 60*time.Second, 500*time.Millisecond, "first mutated status write", func() error {
		var m int64
		t.Add(func(p *Phase) { m = p.Mutated })
		if m == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
	if err != nil {
		t.Error("%v", err)
	}

	skip := map[string]bool{}
	for _, s := range o.skip {
		skip[s] = true
	}
	start := time.Now()
	for cycle := 1; ctx.Err() == nil; cycle++ {
		progress("cycle %d", cycle)
		localCycle(ctx, cycle, o, sc, t, c, rs, n, skip)
		if o.duration == 0 || time.Since(start) >= o.duration {
			break
		}
	}
	t.Begin("final", false, false)
	if err := sc.waitAllReady(ctx); err != nil && ctx.Err() == nil {
		t.Error("%v", err)
	}
	sleepCtx(ctx, 3*time.Second)
	if ctx.Err() != nil {
		t.Error("run interrupted or over its time bound: %v", ctx.Err())
	}
	stopLoad()
	_ = fakeNodes.Stop()
	broken = t.Finish(os.Stdout, o.webhookTimeout)
	fmt.Println(rs.Summary())
	return broken, nil
}

func localCycle(ctx context.Context, cycle int, o localOptions, sc *scenario, t *Tally, c *harness.Cluster, rs *install.Installation, n names, skip map[string]bool) {
	t.Begin("baseline", true, false)
	sleepCtx(ctx, 8*time.Second)
	if !skip["sigterm"] {
		t.Begin("sigterm", true, false)
		sc.kills(ctx, o.killPhase, o.killInterval, false)
		sc.settlePhase(ctx)
	}
	if !skip["sigkill"] {
		t.Begin("sigkill", false, false)
		sc.kills(ctx, o.killPhase, o.killInterval, true)
		sc.settlePhase(ctx)
	}
	if !skip["sigstop"] {
		// A hung replica (stopped process: a long GC pause, a starved CPU): reviews on its
		// open connections wait for the webhook timeout and fail open. Reported, not an
		// invariant; it also shows that the not-mutated, fail-open and slow columns do count.
		t.Begin("sigstop", false, false)
		if r, ok := randomReady(rs); ok {
			if err := r.Send(syscall.SIGSTOP); err != nil {
				t.Error("SIGSTOP replica %d: %v", r.Index, err)
			} else {
				t.Fault("sigstop", fmt.Sprintf("replica %d for 6s", r.Index))
				sleepCtx(ctx, 6*time.Second)
				if err := r.Send(syscall.SIGCONT); err != nil {
					t.Error("SIGCONT replica %d: %v", r.Index, err)
				}
			}
		}
		sc.settlePhase(ctx)
	}
	if !skip["rotation"] {
		t.Begin("leader-kill-rotation", false, false)
		sc.leafRotation(ctx)
		sc.caRotation(ctx)
		sc.settlePhase(ctx)
	}
	if !skip["certfiles"] {
		t.Begin("cert-files", true, false)
		corruptCertFiles(ctx, t, rs, sc)
		sc.settlePhase(ctx)
	}
	if !skip["deletions"] {
		t.Begin("deletions", false, false)
		sc.deletions(ctx)
		sc.settlePhase(ctx)
	}
	if !skip["apiserver"] {
		t.Begin("apiserver-restart", false, true)
		sig := o.apiserverSignal
		if sig == "alternate" {
			sig = map[bool]string{true: "KILL", false: "TERM"}[cycle%2 == 1]
		}
		t.Fault("apiserver-restart-"+strings.ToLower(sig), "kcp restart apiserver --signal="+sig)
		if err := c.Restart("apiserver", "--signal="+sig); err != nil {
			t.Error("%v", err)
		}
		sleepCtx(ctx, 5*time.Second)
		sc.settlePhase(ctx)
	}
}

// corruptCertFiles breaks the mounted certificate files of one ready replica in place
// (truncated, garbage, a key of another pair, empty), checks each time that it keeps serving
// the last good certificate (a TLS handshake that verifies against the live caBundle), then
// restores the files.
func corruptCertFiles(ctx context.Context, t *Tally, rs *install.Installation, sc *scenario) {
	s, ok := randomReady(rs)
	if !ok {
		t.Error("no ready replica to corrupt")
		return
	}
	idx := s.Index
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherDER, _ := x509.MarshalPKCS8PrivateKey(otherKey)
	garbage := make([]byte, 700)
	_, _ = rand.Read(garbage)
	faults := []struct {
		kind, file string
		data       func(crt []byte) []byte
	}{
		{"certfile-truncate", "tls.crt", func(crt []byte) []byte { return crt[:len(crt)/2] }},
		{"certfile-garbage", "tls.key", func([]byte) []byte { return garbage }},
		{"certfile-wrong-key", "tls.key", func([]byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: otherDER}) }},
		{"certfile-empty", "tls.crt", func([]byte) []byte { return nil }},
	}
	for _, f := range faults {
		if ctx.Err() != nil {
			return
		}
		// Resolved each time: a rotation may have swapped ..data since.
		dataDir, err := filepath.EvalSymlinks(filepath.Join(s.TLSDir, "..data"))
		if err != nil {
			t.Error("replica %d tls dir: %v", idx, err)
			return
		}
		crtPath, keyPath := filepath.Join(dataDir, "tls.crt"), filepath.Join(dataDir, "tls.key")
		crt, err1 := os.ReadFile(crtPath)
		key, err2 := os.ReadFile(keyPath)
		if err := errors.Join(err1, err2); err != nil {
			t.Error("read replica %d certificate: %v", idx, err)
			return
		}
		if err := os.WriteFile(filepath.Join(dataDir, f.file), f.data(crt), 0o644); err != nil {
			t.Error("%s: %v", f.kind, err)
			continue
		}
		t.Fault(f.kind, fmt.Sprintf("replica %d %s", idx, f.file))
		// Longer than the watch and the periodic re-read (--cert-reload-interval=2s).
		sleepCtx(ctx, 3*time.Second)
		if err := checkServing(ctx, sc, s); err != nil {
			t.Error("after %s replica %d no longer serves its last good certificate: %v", f.kind, idx, err)
		}
		if !s.Ready() {
			t.Error("after %s replica %d is not ready", f.kind, idx)
		}
		// Put the pair back unless the volume was swapped meanwhile (then it is new anyway).
		if cur, _ := filepath.EvalSymlinks(filepath.Join(s.TLSDir, "..data")); cur == dataDir {
			if err := errors.Join(os.WriteFile(crtPath, crt, 0o644), os.WriteFile(keyPath, key, 0o644)); err != nil {
				t.Error("restore: %v", err)
			}
		}
		sleepCtx(ctx, time.Second)
	}
}

// checkServing does a TLS handshake with the replica as the API server would: server name
// <service>.<namespace>.svc, trust = the live caBundle of the webhook configuration.
func checkServing(ctx context.Context, sc *scenario, s *install.Replica) error {
	mwc, err := sc.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, sc.n.WebhookConfig, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(mwc.Webhooks) == 0 {
		return fmt.Errorf("webhook configuration has no webhooks")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle) {
		return fmt.Errorf("caBundle holds no certificate")
	}
	d := tls.Dialer{Config: &tls.Config{RootCAs: pool, ServerName: "kube-overcommit." + sc.n.Namespace + ".svc"}}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", s.Listen)
	if err != nil {
		return err
	}
	return conn.Close()
}

// randomReady is one of the ready replicas, chosen at random.
func randomReady(in *install.Installation) (*install.Replica, bool) {
	r := in.ReadyReplicas()
	if len(r) == 0 {
		return nil, false
	}
	return r[mrand.IntN(len(r))], true
}

type localTarget struct {
	rs                 *install.Installation
	client             kubernetes.Interface
	n                  names
	binary, kubeconfig string
}

func (l *localTarget) Replicas() int { return len(l.rs.Replicas()) }

func (l *localTarget) Ready(context.Context) []string {
	var out []string
	for _, r := range l.rs.ReadyReplicas() {
		out = append(out, "r"+strconv.Itoa(r.Index))
	}
	return out
}

func (l *localTarget) Stop(_ context.Context, replica string, force bool) error {
	i, err := strconv.Atoi(strings.TrimPrefix(replica, "r"))
	r := l.rs.Replica(i)
	if err != nil || r == nil {
		return fmt.Errorf("no replica %q", replica)
	}
	sig := syscall.SIGTERM
	if force {
		sig = syscall.SIGKILL
	}
	_, err = r.Signal(sig, 15*time.Second)
	return err
}

func (l *localTarget) Leader(ctx context.Context) string {
	r := l.rs.ByIdentity(leaseHolder(ctx, l.client, l.n))
	if r == nil {
		return ""
	}
	return "r" + strconv.Itoa(r.Index)
}

func (l *localTarget) Rotate(ctx context.Context, ca bool) error {
	args := []string{"rotate", "--namespace=" + l.n.Namespace}
	if ca {
		args = append(args, "--ca")
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, l.binary, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kube-overcommit %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *localTarget) FaultKind(force bool) string {
	if force {
		return "sigkill"
	}
	return "sigterm"
}

// startControlPlane starts the local control plane of tests/cluster in runDir (a new temporary
// directory when empty). stop stops it, reports any process left behind, and removes a
// temporary run directory unless the run failed (its logs are then kept).
func startControlPlane(runDir string) (c *harness.Cluster, stop func(failed bool) (broken []string), err error) {
	removeRun := false
	if runDir == "" {
		if runDir, err = os.MkdirTemp("", "kcp-chaos-"); err != nil {
			return nil, nil, err
		}
		removeRun = true
	}
	progress("starting the local control plane in %s", runDir)
	if c, err = harness.New(harness.Options{Nodes: 0, RunDir: runDir}); err != nil {
		return nil, nil, err
	}
	return c, func(failed bool) (broken []string) {
		progress("stopping the control plane")
		if serr := c.Stop(); serr != nil {
			broken = append(broken, "cleanup: "+serr.Error())
		}
		if left := leftovers(runDir); left != "" {
			broken = append(broken, "processes left behind: "+left)
		} else {
			progress("no process left (pgrep -f %s finds nothing)", runDir)
		}
		if removeRun && !failed && len(broken) == 0 {
			_ = os.RemoveAll(runDir)
		} else {
			progress("logs kept in %s/logs", runDir)
		}
		return broken
	}, nil
}

// leftovers lists processes whose command line names the run directory (pgrep -f).
func leftovers(runDir string) string {
	out, err := exec.Command("pgrep", "-af", runDir).Output()
	if err != nil {
		return "" // pgrep exits 1 when nothing matches
	}
	// This process and the script that started it name the run directory when --run-dir is given.
	self, parent := strconv.Itoa(os.Getpid())+" ", strconv.Itoa(os.Getppid())+" "
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" && !strings.HasPrefix(l, self) && !strings.HasPrefix(l, parent) {
			left = append(left, l)
		}
	}
	return strings.Join(left, "; ")
}

func secs(d time.Duration) string { return strconv.FormatInt(int64(d/time.Second), 10) + "s" }

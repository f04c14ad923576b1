// Package supervisor runs a control plane as child processes of one supervisor process and
// implements up, down, status and restart against a run directory.
//
// Process model: `kcp up` starts `kcp supervise` in a new session (so it is its own process
// group leader) and returns once the control plane is ready. The supervisor starts every
// component as a child in its process group with Pdeathsig=SIGKILL, restarts children that
// exit (unless a hold file says not to), and on SIGTERM stops them in reverse order. `kcp down`
// signals the supervisor, then kills the process group and every remaining kcp process of the
// run directory, so nothing survives a crash of any part.
package supervisor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"kube-overcommit/tests/cluster/internal/pki"
	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/spawn"
)

// Options of a control plane.
type Options struct {
	Run           runfiles.Dir
	Nodes         int
	FakeNodeArgs  []string
	APIServerArgs []string
	KeepData      bool
	ReadyTimeout  time.Duration
	// ExitWithPID stops the control plane when that process is gone (a test binary killed by
	// its timeout never runs its cleanup). 0: no such watch.
	ExitWithPID int
	// MaxLifetime stops the control plane after this long. 0: no limit.
	MaxLifetime time.Duration
}

// FreePort asks the kernel for an unused port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// component is one supervised child.
type component struct {
	name string
	args []string
	// ready reports whether the component serves; nil means "started is enough".
	ready func(ctx context.Context) error
}

// Supervise runs the control plane in the foreground until SIGTERM/SIGINT.
func Supervise(opts Options) error {
	run := opts.Run
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, d := range []string{"logs", "pids", "hold", "services", "stats"} {
		if err := os.MkdirAll(run.Path(d), 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(run.Ready())
	if !opts.KeepData {
		if err := os.RemoveAll(run.Etcd()); err != nil {
			return err
		}
	}
	files, err := pki.Ensure(run.PKI())
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	st := runfiles.State{SupervisorPID: os.Getpid(), Nodes: opts.Nodes}
	for _, p := range []*int{&st.EtcdClientPort, &st.EtcdPeerPort, &st.APIServerPort, &st.SchedulerPort, &st.ControllerMgrPort} {
		if *p, err = FreePort(); err != nil {
			return err
		}
	}
	st.Server = fmt.Sprintf("https://127.0.0.1:%d", st.APIServerPort)
	if err := run.WritePid("supervisor", os.Getpid()); err != nil {
		return err
	}
	if err := runfiles.WriteJSON(run.State(), st); err != nil {
		return err
	}
	kc := run.Kubeconfig()
	rd := "--run-dir=" + string(run)
	httpClient, err := adminHTTPClient(files)
	if err != nil {
		return err
	}
	comps := []component{
		{name: "etcd", args: []string{"etcd", rd, "--data-dir=" + run.Etcd(),
			"--client-port=" + strconv.Itoa(st.EtcdClientPort), "--peer-port=" + strconv.Itoa(st.EtcdPeerPort)},
			ready: func(ctx context.Context) error {
				return httpOK(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/health", st.EtcdClientPort))
			}},
		{name: "apiserver", args: append([]string{"apiserver", rd,
			fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", st.EtcdClientPort),
			"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(st.APIServerPort),
			"--tls-cert-file=" + files.ServingCert, "--tls-private-key-file=" + files.ServingKey,
			"--client-ca-file=" + files.CACert,
			// The aggregation layer: the API server proxies to aggregated APIs (metrics-server's
			// metrics.k8s.io) with the front-proxy client certificate and the user in these
			// headers; the aggregated server trusts them through the requestheader CA it reads
			// from kube-system/extension-apiserver-authentication.
			"--requestheader-client-ca-file=" + files.CACert, "--requestheader-allowed-names=" + pki.FrontProxyCN,
			"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + files.FrontProxyCert, "--proxy-client-key-file=" + files.FrontProxyKey,
			"--service-account-key-file=" + files.SAPub, "--service-account-signing-key-file=" + files.SAKey,
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-cluster-ip-range=10.0.0.0/24",
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--profiling=false",
			// Close watches on SIGTERM instead of waiting 60 s for them: restarts take ~1 s.
			"--shutdown-watch-termination-grace-period=3s",
			"--cert-dir=" + run.Path("pki", "apiserver-generated"),
		}, opts.APIServerArgs...),
			ready: func(ctx context.Context) error { return httpOK(ctx, httpClient, st.Server+"/readyz") }},
		{name: "scheduler", args: []string{"scheduler", rd, "--kubeconfig=" + kc,
			"--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(st.SchedulerPort), "--leader-elect=false"},
			ready: func(ctx context.Context) error {
				return httpOK(ctx, insecureClient, fmt.Sprintf("https://127.0.0.1:%d/healthz", st.SchedulerPort))
			}},
		{name: "controller-manager", args: []string{"controller-manager", rd, "--kubeconfig=" + kc,
			"--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(st.ControllerMgrPort), "--leader-elect=false",
			"--root-ca-file=" + files.CACert, "--service-account-private-key-file=" + files.SAKey,
			"--use-service-account-credentials=false"},
			ready: func(ctx context.Context) error {
				return httpOK(ctx, insecureClient, fmt.Sprintf("https://127.0.0.1:%d/healthz", st.ControllerMgrPort))
			}},
	}
	if opts.Nodes > 0 {
		comps = append(comps, component{name: "fake-nodes", args: append([]string{"fake-nodes", rd,
			"--kubeconfig=" + kc, "--count=" + strconv.Itoa(opts.Nodes)}, opts.FakeNodeArgs...)})
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if opts.MaxLifetime > 0 {
		time.AfterFunc(opts.MaxLifetime, func() {
			log.Printf("max lifetime %v reached", opts.MaxLifetime)
			cancel()
		})
	}
	if opts.ExitWithPID > 0 {
		go func() {
			for runfiles.Alive(opts.ExitWithPID) {
				time.Sleep(500 * time.Millisecond)
			}
			log.Printf("process %d is gone", opts.ExitWithPID)
			cancel()
		}()
	}
	env := append(os.Environ(), "KCP_RUN_DIR="+string(run))
	var wg sync.WaitGroup
	procs := make([]*supervised, len(comps))
	for i, c := range comps {
		procs[i] = &supervised{c: c, run: run, self: self, env: env}
		if err := procs[i].startOnce(); err != nil {
			stopAll(procs[:i+1])
			return fmt.Errorf("start %s: %w", c.name, err)
		}
		wg.Add(1)
		go func(p *supervised) { defer wg.Done(); p.keep(ctx) }(procs[i])
		if c.ready != nil {
			if err := waitFor(ctx, opts.ReadyTimeout, c.name, c.ready); err != nil {
				stopAll(procs[:i+1])
				return err
			}
		}
		if c.name == "apiserver" {
			if err := pki.WriteKubeconfig(kc, st.Server, files); err != nil {
				stopAll(procs[:i+1])
				return err
			}
		}
	}
	if err := waitClusterUsable(ctx, opts, kc); err != nil {
		stopAll(procs)
		return err
	}
	if err := os.WriteFile(run.Ready(), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		stopAll(procs)
		return err
	}
	log.Printf("control plane ready at %s (kubeconfig %s)", st.Server, kc)
	<-ctx.Done()
	log.Printf("stopping")
	_ = os.Remove(run.Ready())
	stopAll(procs)
	wg.Wait()
	_ = os.Remove(run.Pid("supervisor"))
	return nil
}

// waitClusterUsable waits for what a test needs beyond /readyz: the default ServiceAccount
// (created by the controller manager; pods are rejected without it) and the fake nodes Ready.
func waitClusterUsable(ctx context.Context, opts Options, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, opts.ReadyTimeout, "default service account", func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	if opts.Nodes == 0 {
		return nil
	}
	return waitFor(ctx, opts.ReadyTimeout, "fake nodes Ready", func(ctx context.Context) error {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready < opts.Nodes {
			return fmt.Errorf("%d of %d nodes Ready", ready, opts.Nodes)
		}
		return nil
	})
}

type supervised struct {
	c    component
	run  runfiles.Dir
	self string
	env  []string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	stopping bool
}

func (p *supervised) startOnce() error {
	logf, err := os.OpenFile(p.run.Log(p.c.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.self, p.c.args...)
	cmd.Env = p.env
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Same process group as the supervisor (kill -PGID reaches everyone); SIGKILL if the
	// supervisor dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn.Start(cmd); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	log.Printf("started %s pid %d", p.c.name, cmd.Process.Pid)
	return p.run.WritePid(p.c.name, cmd.Process.Pid)
}

// keep restarts the component whenever it exits, until ctx ends. A hold file delays the
// restart (kcp restart --down-for).
func (p *supervised) keep(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for {
		p.mu.Lock()
		exited := p.exited
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		p.mu.Lock()
		stopping := p.stopping
		state := p.cmd.ProcessState
		p.mu.Unlock()
		if stopping || ctx.Err() != nil {
			return
		}
		log.Printf("%s exited (%v); restarting", p.c.name, state)
		for {
			if _, err := os.Stat(p.run.Hold(p.c.name)); err != nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if err := p.startOnce(); err != nil {
			log.Printf("restart %s: %v", p.c.name, err)
			backoff = min(backoff*2, 5*time.Second)
			// Fake an exit so the loop retries.
			ch := make(chan struct{})
			close(ch)
			p.mu.Lock()
			p.exited = ch
			p.mu.Unlock()
			continue
		}
		backoff = 200 * time.Millisecond
	}
}

func (p *supervised) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
	_ = os.Remove(p.run.Pid(p.c.name))
}

func stopAll(procs []*supervised) {
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i] != nil {
			procs[i].stop(10 * time.Second)
		}
	}
}

func waitFor(ctx context.Context, timeout time.Duration, what string, f func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = f(cctx)
		cancel()
		if last == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var insecureClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a self-signed component
}}

func adminHTTPClient(f pki.Files) (*http.Client, error) {
	ca, err := os.ReadFile(f.CACert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("bad CA file")
	}
	cert, err := tls.LoadX509KeyPair(f.AdminCert, f.AdminKey)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}

// AdminHTTPClient is an HTTPS client trusted by and authenticated to the run's API server.
func AdminHTTPClient(run runfiles.Dir) (*http.Client, error) {
	return adminHTTPClient(pki.FilesIn(run.PKI()))
}

func httpOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}

// Command kcp is a multi-call binary (like hyperkube) for a local Kubernetes control plane:
// the Kubernetes code is compiled and linked once, and every component runs as a separate
// process of this binary. See tests/cluster/README.md.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"kube-overcommit/tests/cluster/internal/components"
	"kube-overcommit/tests/cluster/internal/fakenode"
	"kube-overcommit/tests/cluster/internal/metricsserver"
	"kube-overcommit/tests/cluster/internal/pki"
	"kube-overcommit/tests/cluster/internal/podrunner"
	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/secretvolume"
	"kube-overcommit/tests/cluster/internal/services"
	"kube-overcommit/tests/cluster/internal/supervisor"
)

const usage = `kcp: local Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, fake kubelets) on 127.0.0.1.

Usage: kcp <command> [flags]      (run dir: --run-dir, else $KCP_RUN_DIR, else $KCP_DEFAULT_RUN_DIR)

  up [--nodes N] [--fake-node-arg=F]... [--apiserver-arg=F]... [--keep-data] [--timeout D]
     [--max-lifetime D] [--exit-with-pid PID]
                    start everything in the background; return when ready
  down              stop every process of the run dir (also after crashes)
  status            show components and /readyz; exit 1 if not ready
  restart <component> [--signal TERM|KILL] [--down-for D]
                    stop a component (etcd, apiserver, scheduler, controller-manager,
                    fake-nodes) and wait until the supervisor has it back
  backend add|remove|list --namespace NS --service SVC [--port P] [--addr HOST:PORT] [--ready-url URL]
                    webhook backends of a Service (the API server's service resolver)
  fake-nodes [flags]        run fake kubelets (see kcp fake-nodes --help)
  pod-runner [flags]        fake kubelets that run matching pods as local processes
  hollow-nodes [flags]      real kubelets (kubemark's hollow kubelet, fake runtime), one
                            hollow-node process each (see kcp hollow-nodes --help)
  secret-volume [flags]     mirror a Secret into a directory like the kubelet
  kubectl [args]            kubectl (KUBECONFIG defaults to <run dir>/kubeconfig)
  metrics-server [--port P] [upstream flags]
                    the real metrics-server, registered as APIService v1beta1.metrics.k8s.io,
                    scraping the fake kubelets started with --resource-metrics
  etcd | apiserver | scheduler | controller-manager  [upstream flags]   one component
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	sub, args := os.Args[1], os.Args[2:]
	var code int
	switch sub {
	case "apiserver":
		code = components.APIServer(args)
	case "scheduler":
		code = components.Scheduler(args)
	case "controller-manager":
		code = components.ControllerManager(args)
	case "kubectl":
		code = components.Kubectl(args)
	case "metrics-server":
		code = cmdMetricsServer(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		f, ok := commands[sub]
		if !ok {
			fmt.Fprintf(os.Stderr, "kcp: unknown command %q\n\n%s", sub, usage)
			os.Exit(2)
		}
		if err := f(args); err != nil {
			fmt.Fprintf(os.Stderr, "kcp %s: %v\n", sub, err)
			code = 1
		}
	}
	os.Exit(code)
}

var commands = map[string]func([]string) error{
	"up":            cmdUp,
	"supervise":     cmdSupervise,
	"down":          cmdDown,
	"status":        cmdStatus,
	"restart":       cmdRestart,
	"etcd":          cmdEtcd,
	"fake-nodes":    cmdFakeNodes,
	"pod-runner":    cmdPodRunner,
	"secret-volume": cmdSecretVolume,
	"backend":       cmdBackend,
	"hollow-node":   cmdHollowNode,
	"hollow-nodes":  cmdHollowNodes,
}

func newFlags(name string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet("kcp "+name, pflag.ContinueOnError)
	runDir := fs.String("run-dir", "", "run directory (default $KCP_RUN_DIR, else $KCP_DEFAULT_RUN_DIR)")
	return fs, runDir
}

func upOptions(fs *pflag.FlagSet) func(runfiles.Dir) supervisor.Options {
	nodes := fs.Int("nodes", 0, "fake nodes to run under the supervisor")
	nodeArgs := fs.StringArray("fake-node-arg", nil, "flag for the supervised fake-nodes (repeatable), e.g. --fake-node-arg=--cpu=16")
	apiArgs := fs.StringArray("apiserver-arg", nil, "extra kube-apiserver flag (repeatable)")
	keep := fs.Bool("keep-data", false, "keep etcd data of an earlier run")
	timeout := fs.Duration("timeout", 180*time.Second, "how long to wait for readiness")
	exitWith := fs.Int("exit-with-pid", 0, "stop the control plane when this process is gone (tests pass their own pid)")
	lifetime := fs.Duration("max-lifetime", 0, "stop the control plane after this long (0: until kcp down)")
	return func(run runfiles.Dir) supervisor.Options {
		return supervisor.Options{Run: run, Nodes: *nodes, FakeNodeArgs: *nodeArgs, APIServerArgs: *apiArgs,
			KeepData: *keep, ReadyTimeout: *timeout, ExitWithPID: *exitWith, MaxLifetime: *lifetime}
	}
}

func cmdUp(args []string) error {
	fs, runDir := newFlags("up")
	opts := upOptions(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	return supervisor.Up(opts(run), os.Stdout)
}

func cmdSupervise(args []string) error {
	fs, runDir := newFlags("supervise")
	opts := upOptions(fs)
	ready := fs.Duration("ready-timeout", 180*time.Second, "per-step readiness timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	o := opts(run)
	o.ReadyTimeout = *ready
	return supervisor.Supervise(o)
}

func cmdDown(args []string) error {
	fs, runDir := newFlags("down")
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	return supervisor.Down(run, os.Stdout)
}

func cmdStatus(args []string) error {
	fs, runDir := newFlags("status")
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	return supervisor.Status(run, os.Stdout)
}

func cmdRestart(args []string) error {
	fs, runDir := newFlags("restart")
	sig := fs.String("signal", "TERM", "signal that stops the component: TERM (graceful) or KILL (crash)")
	downFor := fs.Duration("down-for", 0, "keep the component down this long before the supervisor restarts it")
	timeout := fs.Duration("timeout", 120*time.Second, "how long to wait for exit and for readiness")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: kcp restart <%s>", strings.Join(supervisor.Components, "|"))
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	var s syscall.Signal
	switch strings.ToUpper(strings.TrimPrefix(strings.ToUpper(*sig), "SIG")) {
	case "TERM":
		s = syscall.SIGTERM
	case "KILL":
		s = syscall.SIGKILL
	case "INT":
		s = syscall.SIGINT
	default:
		return fmt.Errorf("--signal %q: use TERM, INT or KILL", *sig)
	}
	return supervisor.Restart(run, fs.Arg(0), s, *downFor, *timeout, os.Stdout)
}

func cmdEtcd(args []string) error {
	fs, _ := newFlags("etcd")
	dataDir := fs.String("data-dir", "", "etcd data directory")
	clientPort := fs.Int("client-port", 2379, "client port on 127.0.0.1")
	peerPort := fs.Int("peer-port", 2380, "peer port on 127.0.0.1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	return components.Etcd(*dataDir, *clientPort, *peerPort)
}

func restConfigFor(kubeconfig string, run runfiles.Dir) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = run.Kubeconfig()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

func clientFor(kubeconfig string, run runfiles.Dir, qps float32) (*kubernetes.Clientset, error) {
	cfg, err := restConfigFor(kubeconfig, run)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, int(qps*2)
	cfg.UserAgent = "kcp-fake-kubelet"
	return kubernetes.NewForConfig(cfg)
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// fakeNodeFlags adds the fake kubelet flags (shared by fake-nodes and pod-runner) to fs; the
// returned function builds the configuration once fs is parsed.
func fakeNodeFlags(fs *pflag.FlagSet, defaultPrefix string) func(run runfiles.Dir) (fakenode.Config, error) {
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default <run dir>/kubeconfig)")
	count := fs.Int("count", 1, "number of nodes")
	prefix := fs.String("prefix", defaultPrefix, "node name prefix; nodes are <prefix>-<index>")
	startIndex := fs.Int("start-index", 0, "index of the first node")
	cpu := fs.String("cpu", "8", "capacity cpu")
	memory := fs.String("memory", "32Gi", "capacity memory")
	pods := fs.String("pods", "110", "capacity pods")
	eph := fs.String("ephemeral-storage", "100Gi", "capacity ephemeral-storage")
	aCPU := fs.String("allocatable-cpu", "", "allocatable cpu (default: capacity)")
	aMemory := fs.String("allocatable-memory", "", "allocatable memory (default: capacity)")
	aPods := fs.String("allocatable-pods", "", "allocatable pods (default: capacity)")
	aEph := fs.String("allocatable-ephemeral-storage", "", "allocatable ephemeral-storage (default: capacity)")
	labels := fs.StringToString("labels", nil, "extra node labels k=v,k2=v2")
	images := fs.Int("images", 0, "container images each node reports (a real node: ~50)")
	update := fs.Duration("status-update-frequency", 10*time.Second, "kubelet nodeStatusUpdateFrequency")
	report := fs.Duration("status-report-frequency", 5*time.Minute, "kubelet nodeStatusReportFrequency")
	lease := fs.Duration("lease-duration", 40*time.Second, "node lease duration; renewed every quarter")
	slow := fs.Duration("slow-threshold", 2*time.Second, "status writes slower than this count as slow")
	anno := fs.String("mutated-annotation", "overcommit.dev/applied", "annotation that marks a mutated Node in a write's response")
	statsFile := fs.String("stats-file", "", "stats JSON, rewritten every second (default <run dir>/stats/<prefix>.json)")
	statsAddr := fs.String("stats-addr", "", "also serve GET /stats on this 127.0.0.1:PORT")
	runPods := fs.Bool("run-pods", true, "mark pods bound to these nodes Running/Ready and finish their deletion")
	deleteOnExit := fs.Bool("delete-on-exit", false, "delete the Node and Lease objects on exit")
	qps := fs.Float32("qps", 500, "client QPS limit (shared by all nodes of this process)")
	resMetrics := fs.Bool("resource-metrics", false, "serve each node's GET /metrics/resource over TLS (certificate from the run's CA) on its own 127.0.0.1 port, published as the kubelet endpoint port; usage scripted by the "+fakenode.UsageAnnotation+" annotation")
	asNode := fs.Bool("as-node", true, "register and write node status as the node itself (user system:node:<name>, group system:nodes, impersonated by the kubeconfig's user), as a kubelet does; false: as the kubeconfig's user")
	return func(run runfiles.Dir) (fakenode.Config, error) {
		if *count < 0 || *update <= 0 || *report <= 0 || *lease < 4*time.Second {
			return fakenode.Config{}, fmt.Errorf("bad --count/--status-update-frequency/--status-report-frequency/--lease-duration")
		}
		capacity, err := fakenode.ParseResources(map[string]string{"cpu": *cpu, "memory": *memory, "pods": *pods, "ephemeral-storage": *eph})
		if err != nil {
			return fakenode.Config{}, err
		}
		alloc, err := fakenode.ParseResources(map[string]string{"cpu": *aCPU, "memory": *aMemory, "pods": *aPods, "ephemeral-storage": *aEph})
		if err != nil {
			return fakenode.Config{}, err
		}
		for k, v := range capacity {
			if _, ok := alloc[k]; !ok {
				alloc[k] = v
			}
		}
		client, err := clientFor(*kubeconfig, run, *qps)
		if err != nil {
			return fakenode.Config{}, err
		}
		if *statsFile == "" {
			*statsFile = run.Stats(*prefix)
		}
		var kubeletCert func(string) (tls.Certificate, error)
		if *resMetrics {
			files := pki.FilesIn(run.PKI())
			kubeletCert = func(node string) (tls.Certificate, error) { return pki.IssueServing(files, node, node) }
		}
		var nodeClient func(string) (kubernetes.Interface, error)
		if *asNode {
			base, err := restConfigFor(*kubeconfig, run)
			if err != nil {
				return fakenode.Config{}, err
			}
			base.QPS, base.Burst = *qps, int(*qps*2)
			base.UserAgent = "kcp-fake-kubelet"
			nodeClient = func(name string) (kubernetes.Interface, error) {
				return fakenode.NodeClient(base, name)
			}
		}
		return fakenode.Config{
			NodeClient: nodeClient,
			Client:     client, Prefix: *prefix, Count: *count, StartIndex: *startIndex,
			Shape:        fakenode.Shape{Capacity: capacity, Allocatable: alloc, Labels: *labels, Images: *images},
			StatusUpdate: *update, StatusReport: *report, LeaseDuration: *lease, SlowThreshold: *slow,
			MutatedAnno: *anno, StatsFile: *statsFile, StatsAddr: *statsAddr, RunPods: *runPods, DeleteOnExit: *deleteOnExit,
			KubeletCert: kubeletCert,
		}, nil
	}
}

func cmdFakeNodes(args []string) error {
	fs, runDir := newFlags("fake-nodes")
	config := fakeNodeFlags(fs, "fake-node")
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	cfg, err := config(run)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return fakenode.Run(ctx, cfg)
}

// cmdPodRunner runs fake kubelets whose pods matching --selector run as local processes
// (package podrunner); their other pods are marked Running as by fake-nodes.
func cmdPodRunner(args []string) error {
	fs, runDir := newFlags("pod-runner")
	config := fakeNodeFlags(fs, "runner")
	selector := fs.String("selector", "app.kubernetes.io/name=kube-overcommit", "label selector of the pods run as processes")
	images := fs.StringArray("image", nil, "PATTERN=BINARY: run containers whose image matches PATTERN (* = anything) as BINARY (repeatable; default '*kube-overcommit*=$KUBE_OVERCOMMIT_BIN' when that is set)")
	secretDelay := fs.Duration("secret-delay", 5*time.Second, "how long a Secret change takes to reach the volumes (the kubelet's sync period)")
	backoff := fs.Duration("restart-backoff", time.Second, "first delay before a container restart, doubled up to --max-restart-backoff")
	maxBackoff := fs.Duration("max-restart-backoff", 30*time.Second, "longest delay before a container restart")
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	cfg, err := config(run)
	if err != nil {
		return err
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		return fmt.Errorf("--selector: %w", err)
	}
	if len(*images) == 0 && os.Getenv("KUBE_OVERCOMMIT_BIN") != "" {
		*images = []string{"*kube-overcommit*=" + os.Getenv("KUBE_OVERCOMMIT_BIN")}
	}
	if len(*images) == 0 {
		return fmt.Errorf("no --image PATTERN=BINARY rule (and KUBE_OVERCOMMIT_BIN is not set)")
	}
	var rules []podrunner.ImageRule
	for _, s := range *images {
		r, err := podrunner.ParseImageRule(s)
		if err != nil {
			return err
		}
		if _, err := os.Stat(r.Binary); err != nil {
			return fmt.Errorf("--image %s: %w", s, err)
		}
		rules = append(rules, r)
	}
	restCfg, err := restConfigFor(fs.Lookup("kubeconfig").Value.String(), run)
	if err != nil {
		return err
	}
	nodes := map[string]bool{}
	for i := 0; i < cfg.Count; i++ {
		nodes[fakenode.NodeName(cfg.Prefix, cfg.StartIndex+i)] = true
	}
	pr := podrunner.Config{
		Client: cfg.Client, RestConfig: restCfg, Nodes: nodes, Selector: sel, Images: rules,
		Dir: run.Path("pods", cfg.Prefix), LogDir: run.Path("logs"), ServicesDir: run.Services(),
		SecretDelay: *secretDelay, RestartBackoff: *backoff, MaxRestartBackoff: *maxBackoff,
	}
	// The fake kubelet marks the other pods of these nodes Running, as fake-nodes does.
	cfg.PodFilter = func(p *corev1.Pod) bool { return !pr.Mine(p) }
	ctx, stop := signalContext()
	defer stop()
	errs := make(chan error, 2)
	go func() { errs <- fakenode.Run(ctx, cfg) }()
	go func() { errs <- podrunner.Run(ctx, pr) }()
	err = <-errs
	stop()
	return errors.Join(err, <-errs)
}

func cmdSecretVolume(args []string) error {
	fs, runDir := newFlags("secret-volume")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default <run dir>/kubeconfig)")
	ns := fs.String("namespace", "default", "namespace of the Secret")
	name := fs.String("name", "", "name of the Secret")
	dir := fs.String("dir", "", "directory to mirror into (the volume's mount point)")
	delay := fs.Duration("delay", 0, "apply each change this long after seeing it")
	mode := fs.Int32("mode", 0o644, "file mode (the volume's defaultMode)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || *dir == "" {
		return fmt.Errorf("--name and --dir are required")
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	client, err := clientFor(*kubeconfig, run, 20)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return secretvolume.Run(ctx, secretvolume.Config{Client: client, Namespace: *ns, Name: *name, Dir: *dir, Delay: *delay, Mode: *mode})
}

func cmdBackend(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: kcp backend add|remove|list --namespace NS --service SVC [--port P] [--addr HOST:PORT] [--ready-url URL]")
	}
	op := args[0]
	fs, runDir := newFlags("backend " + op)
	ns := fs.String("namespace", "", "namespace of the Service")
	svc := fs.String("service", "", "name of the Service")
	port := fs.Int32("port", 0, "Service port the backend serves (0: any)")
	addr := fs.String("addr", "", "backend address 127.0.0.1:PORT")
	ready := fs.String("ready-url", "", "URL whose 200 answer marks the backend ready (empty: always ready)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *ns == "" || *svc == "" {
		return fmt.Errorf("--namespace and --service are required")
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	switch op {
	case "add":
		return services.Add(run.Services(), *ns, *svc, services.Backend{Addr: *addr, Port: *port, ReadyURL: *ready})
	case "remove":
		if *addr == "" {
			return fmt.Errorf("--addr is required")
		}
		return services.Remove(run.Services(), *ns, *svc, *addr, *port)
	case "list":
		bs, err := services.List(run.Services(), *ns, *svc)
		for _, b := range bs {
			fmt.Printf("%s port=%d ready=%s\n", b.Addr, b.Port, b.ReadyURL)
		}
		return err
	default:
		return fmt.Errorf("unknown backend operation %q (add, remove, list)", op)
	}
}

// cmdMetricsServer runs the real metrics-server on 127.0.0.1:--port (default: a free port),
// registered with the API server's aggregator (package metricsserver); other flags go to
// metrics-server after the defaults, so they override them. The registry backend is removed
// when it stops; the APIService stays (metrics.k8s.io then answers 503).
func cmdMetricsServer(args []string) int {
	var rest []string
	runDir, port, help := "", 0, false
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--run-dir="); ok {
			runDir = v
			continue
		}
		if v, ok := strings.CutPrefix(a, "--port="); ok {
			p, err := strconv.Atoi(v)
			if err != nil || p <= 0 || p > 65535 {
				fmt.Fprintf(os.Stderr, "kcp metrics-server: bad --port %q\n", v)
				return 2
			}
			port = p
			continue
		}
		help = help || a == "-h" || a == "--help"
		rest = append(rest, a)
	}
	if help {
		return components.MetricsServer(rest)
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "kcp metrics-server: %v\n", err)
		return 1
	}
	run, err := runfiles.Resolve(runDir)
	if err != nil {
		return fail(err)
	}
	files, err := pki.Ensure(run.PKI())
	if err != nil {
		return fail(err)
	}
	if port == 0 {
		if port, err = supervisor.FreePort(); err != nil {
			return fail(err)
		}
	}
	cfg, err := restConfigFor("", run)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := metricsserver.Unregister(run, port); err != nil {
			fmt.Fprintf(os.Stderr, "kcp metrics-server: %v\n", err)
		}
	}()
	// Registered once it serves, so the aggregator's first availability check succeeds; if
	// registration fails, metrics-server is stopped and the command fails.
	registered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		err := metricsserver.RegisterWhenServing(ctx, cfg, run, files, port)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kcp metrics-server: register: %v\n", err)
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		} else {
			fmt.Fprintf(os.Stderr, "kcp metrics-server: registered, serving on 127.0.0.1:%d\n", port)
		}
		registered <- err
	}()
	code := components.MetricsServer(append(metricsserver.Args(run, files, port), metricsserver.ExcludeHollow(rest)...))
	select {
	case err := <-registered:
		if err != nil && code == 0 {
			code = 1
		}
	default:
	}
	return code
}

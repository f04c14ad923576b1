package main

import (
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"kube-overcommit/tests/cluster/internal/fakenode"
	"kube-overcommit/tests/cluster/internal/hollowkubelet"
	"kube-overcommit/tests/cluster/internal/hollownode"
	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/supervisor"
)

// hollowFlags adds the flags of one hollow kubelet to fs (shared by hollow-node and
// hollow-nodes, which passes them on); the returned function builds its configuration.
func hollowFlags(fs *pflag.FlagSet) func(run runfiles.Dir, name string, port int) (hollowkubelet.Config, error) {
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default <run dir>/kubeconfig)")
	cpu := fs.Int("cpu", 8, "capacity cpu (whole cores, reported by the fake cadvisor)")
	memory := fs.String("memory", "32Gi", "capacity memory")
	pods := fs.Int("pods", 110, "capacity pods (the kubelet's maxPods)")
	labels := fs.StringToString("labels", nil, "extra node labels k=v,k2=v2 (registered by the kubelet; "+hollownode.Label+"=true is always set)")
	update := fs.Duration("status-update-frequency", 10*time.Second, "kubelet nodeStatusUpdateFrequency")
	report := fs.Duration("status-report-frequency", 5*time.Minute, "kubelet nodeStatusReportFrequency")
	lease := fs.Duration("lease-duration", 40*time.Second, "kubelet nodeLeaseDurationSeconds (renewed every quarter)")
	qps := fs.Float32("qps", 50, "client QPS limit")
	asNode := fs.Bool("as-node", true, "act as the node (user system:node:<name>, group system:nodes, impersonated by the kubeconfig's user), as a kubelet's own credentials do")
	verbosity := fs.Int("v", 0, "kubelet log verbosity (klog)")
	return func(run runfiles.Dir, name string, port int) (hollowkubelet.Config, error) {
		mem, err := resource.ParseQuantity(*memory)
		if err != nil || *cpu <= 0 || *pods <= 0 || *update <= 0 || *report <= 0 || *lease < 4*time.Second {
			return hollowkubelet.Config{}, fmt.Errorf("bad --cpu/--memory/--pods/--status-update-frequency/--status-report-frequency/--lease-duration")
		}
		var kfs goflag.FlagSet
		klog.InitFlags(&kfs)
		_ = kfs.Set("v", strconv.Itoa(*verbosity))
		rc, err := restConfigFor(*kubeconfig, run)
		if err != nil {
			return hollowkubelet.Config{}, err
		}
		rc.QPS, rc.Burst = *qps, int(*qps*2)
		if *asNode {
			rc = fakenode.NodeRestConfig(rc, name)
		}
		return hollowkubelet.Config{
			Name: name, Dir: run.Path("hollow", name), RestConfig: rc, Port: port,
			CPUCores: *cpu, MemoryBytes: uint64(mem.Value()), MaxPods: *pods, Labels: *labels,
			StatusUpdate: *update, StatusReport: *report, LeaseDuration: *lease,
		}, nil
	}
}

// cmdHollowNode runs one hollow kubelet (package hollowkubelet) in this process.
func cmdHollowNode(args []string) error {
	fs, runDir := newFlags("hollow-node")
	name := fs.String("name", "", "node name (required)")
	port := fs.Int("port", 0, "kubelet server port on 127.0.0.1 (0: a free port)")
	config := hollowFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return fmt.Errorf("--name is required")
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	if *port == 0 {
		if *port, err = supervisor.FreePort(); err != nil {
			return err
		}
	}
	cfg, err := config(run, *name, *port)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return hollowkubelet.Run(ctx, cfg)
}

// groupFlags are hollow-nodes' own flags; the others are passed on to each hollow-node.
var groupFlags = []string{"run-dir", "prefix", "count", "start-index"}

// cmdHollowNodes runs --count hollow kubelets <prefix>-<i>, one `kcp hollow-node` child each.
func cmdHollowNodes(args []string) error {
	fs, runDir := newFlags("hollow-nodes")
	prefix := fs.String("prefix", "hollow", "node name prefix; nodes are <prefix>-<index>")
	count := fs.Int("count", 1, "number of nodes")
	start := fs.Int("start-index", 0, "index of the first node")
	config := hollowFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	run, err := runfiles.Resolve(*runDir)
	if err != nil {
		return err
	}
	if _, err := config(run, *prefix, 1); err != nil { // the children's flags, checked once here
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pass := hollownode.WithoutFlags(args, groupFlags)
	g := hollownode.Group{
		Binary: self, LogDir: run.Path("logs"), LogPrefix: "hollow-node-",
		Env: append(os.Environ(), "KCP_RUN_DIR="+string(run)),
		Args: func(name string) []string {
			return append([]string{"hollow-node", "--run-dir=" + string(run), "--name=" + name}, pass...)
		},
	}
	for i := 0; i < *count; i++ {
		g.Names = append(g.Names, fakenode.NodeName(*prefix, *start+i))
	}
	ctx, stop := signalContext()
	defer stop()
	fmt.Fprintf(os.Stderr, "kcp hollow-nodes: %d kubelets %s, logs %s\n", *count, strings.Join(g.Names, " "),
		filepath.Join(g.LogDir, g.LogPrefix+"<name>.log"))
	return g.Run(ctx)
}

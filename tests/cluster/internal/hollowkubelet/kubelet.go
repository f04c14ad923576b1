// Package hollowkubelet runs Kubernetes' own kubelet without a machine of its own: kubemark's
// hollow kubelet (k8s.io/kubernetes/pkg/kubemark, as cmd/kubemark builds it) with the fake CRI
// runtime and image service on a unix socket in the run directory, a fake cadvisor reporting
// the configured machine, and the stub container manager (no cgroups, no iptables). The node
// status loop, the Lease, registration and pod admission are the kubelet's code.
//
// One kubelet per process: the kubelet keeps process-wide state (metrics registered once with
// its node name, ContainerLogsDir, the open-files rlimit); hollownode.Group runs one process per
// node.
//
// Nothing may dial a hollow node. Its kubelet server listens on 127.0.0.1 only (read-only port
// off), and the node IP given to the kubelet is 127.0.0.1, which the kubelet refuses ("nodeIP
// can't be loopback address", logged at each status sync): the node reports no address at all,
// so the API server (logs, exec, proxy) and metrics-server have nowhere to connect. Without a
// node IP it would look the node name up in DNS and report the machine's own address. The nodes
// also carry hollownode.Label, which the metrics-server of tests/cluster excludes.
package hollowkubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"go.opentelemetry.io/otel/trace/noop"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/kubelet"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubemark"

	"kube-overcommit/tests/cluster/internal/hollownode"
)

// Config of one hollow kubelet.
type Config struct {
	Name string
	// Dir holds everything the kubelet writes: root directory, pod logs, static pods, container
	// log links, the fake runtime's socket.
	Dir string
	// RestConfig is the kubelet's client configuration (a node identity, see fakenode.NodeRestConfig).
	RestConfig *rest.Config
	// Port of the kubelet server on 127.0.0.1 (0: a free port).
	Port int
	// Machine reported by the fake cadvisor: whole cores and bytes; MaxPods is the pods capacity.
	CPUCores    int
	MemoryBytes uint64
	MaxPods     int
	Labels      map[string]string
	// The kubelet's nodeStatusUpdateFrequency / nodeStatusReportFrequency (defaults 10 s / 5 min)
	// and nodeLeaseDurationSeconds (40 s; renewed every quarter).
	StatusUpdate  time.Duration
	StatusReport  time.Duration
	LeaseDuration time.Duration
}

// machine is the fake cadvisor reporting the configured cores and memory.
type machine struct {
	cadvisortest.Fake
	cores  int
	memory uint64
}

func (m *machine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo()
	if err != nil {
		return nil, err
	}
	info.NumCores, info.MemoryCapacity = m.cores, m.memory
	return info, nil
}

// kubeletConfig is kubemark's configuration of a hollow kubelet with its directories in dir,
// every listener on 127.0.0.1 and the configured shape and frequencies.
func kubeletConfig(cfg Config) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration, error) {
	labels := map[string]string{hollownode.Label: "true"}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	f, c := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: cfg.Name, KubeletPort: cfg.Port, KubeletReadOnlyPort: 0, MaxPods: cfg.MaxPods, NodeLabels: labels,
	})
	// GetHollowKubeletConfig makes its directories under /tmp; they are replaced by the run's.
	if err := os.RemoveAll(f.RootDirectory); err != nil {
		return nil, nil, err
	}
	root := filepath.Join(cfg.Dir, "root")
	for _, d := range []string{root, filepath.Join(cfg.Dir, "static-pods"), filepath.Join(cfg.Dir, "pod-logs"), filepath.Join(cfg.Dir, "containers")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, err
		}
	}
	f.RootDirectory, f.CertDirectory = root, filepath.Join(root, "pki")
	c.StaticPodPath, c.PodLogsDir = filepath.Join(cfg.Dir, "static-pods"), filepath.Join(cfg.Dir, "pod-logs")
	// Refused by the kubelet as loopback: the node reports no address (see the package comment).
	f.NodeIP = "127.0.0.1"
	c.Address, c.HealthzBindAddress, c.HealthzPort = "127.0.0.1", "127.0.0.1", 0
	c.MakeIPTablesUtilChains = false
	c.KubeletCgroups, c.SystemCgroups, c.CgroupRoot, c.CgroupsPerQOS, c.EnforceNodeAllocatable = "", "", "", false, nil
	c.FailSwapOn = false
	c.NodeStatusUpdateFrequency.Duration = cfg.StatusUpdate
	c.NodeStatusReportFrequency.Duration = cfg.StatusReport
	c.NodeLeaseDurationSeconds = int32(cfg.LeaseDuration / time.Second)
	// The kubelet sets RLIMIT_NOFILE of its process to this: keep the hard limit there is.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		c.MaxOpenFiles = int64(lim.Max)
	}
	return f, c, nil
}

// Run runs the kubelet until ctx ends (the kubelet has no clean stop: the process exits).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Port == 0 {
		return fmt.Errorf("hollow node %s: no kubelet port", cfg.Name)
	}
	// The kubelet creates the container log directory (/var/log/containers) at start.
	kubelet.ContainerLogsDir = filepath.Join(cfg.Dir, "containers")
	f, c, err := kubeletConfig(cfg)
	if err != nil {
		return err
	}
	client, heartbeat, err := clients(cfg, c)
	if err != nil {
		return err
	}
	endpoint := "unix://" + filepath.Join(cfg.Dir, "cri.sock")
	_ = os.Remove(filepath.Join(cfg.Dir, "cri.sock"))
	runtime := fakeremote.NewFakeRemoteRuntime()
	if err := runtime.Start(endpoint); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	defer runtime.Stop()
	runtimeService, err := remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		return fmt.Errorf("runtime service: %w", err)
	}
	hk := kubemark.NewHollowKubelet(f, c, client, heartbeat,
		&machine{Fake: cadvisortest.Fake{NodeName: cfg.Name}, cores: cfg.CPUCores, memory: cfg.MemoryBytes},
		runtime.ImageService, runtimeService, cm.NewStubContainerManager())
	go hk.Run(ctx)
	<-ctx.Done()
	return nil
}

// clients are the kubelet's API client and its heartbeat client, configured as cmd/kubemark does.
func clients(cfg Config, c *kubeletconfig.KubeletConfiguration) (*clientset.Clientset, *clientset.Clientset, error) {
	rc := rest.CopyConfig(cfg.RestConfig)
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.UserAgent = "hollow-kubelet"
	client, err := clientset.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	hb := rest.CopyConfig(rc)
	hb.Timeout = min(c.NodeStatusUpdateFrequency.Duration, time.Duration(c.NodeLeaseDurationSeconds)*time.Second)
	hb.QPS = -1
	heartbeat, err := clientset.NewForConfig(hb)
	return client, heartbeat, err
}

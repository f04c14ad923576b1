// Package podrunner is a kubelet for the local control plane that runs processes: for pods
// bound to its nodes that match a selector, it starts the container's image as a local binary
// (image -> binary rules), with the pod's command, args and env (downward API included), the
// ServiceAccount's identity (a TokenRequest token in a kubeconfig passed as KUBECONFIG), its
// Secret volumes (the kubelet's AtomicWriter, kept in sync with a delay), its own 127.0.0.1
// ports, httpGet readiness and liveness probes (Ready condition, restarts), the Service
// backends in the API server's resolver registry while Ready, and the kubelet's graceful
// deletion (preStop, SIGTERM, grace period, SIGKILL, final delete). See tests/cluster/README.md.
//
// The pure rules (ports, mounts, env, probes, kill plan, backends) are in spec.go.
package podrunner

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Config of a pod runner.
type Config struct {
	Client kubernetes.Interface
	// RestConfig gives the API server URL and CA written into each pod's kubeconfig.
	RestConfig *rest.Config
	// Nodes whose pods this runner runs.
	Nodes map[string]bool
	// Selector picks the pods that run as processes (the others are left to the fake kubelet).
	Selector labels.Selector
	// Images map container images to local binaries.
	Images []ImageRule
	// Dir holds one directory per pod (volumes, service account token, kubeconfig).
	Dir string
	// LogDir gets one log per pod: pod-<namespace>-<name>.log (every container, every restart).
	LogDir string
	// ServicesDir is the API server resolver's registry (package services).
	ServicesDir string
	// SecretDelay is how long a Secret change takes to reach a volume (the kubelet's sync
	// period and cache make it up to about a minute in a cluster).
	SecretDelay time.Duration
	// RestartBackoff is the first delay before a container is restarted, doubled up to
	// MaxRestartBackoff (the kubelet's CrashLoopBackOff: 10 s to 5 min).
	RestartBackoff, MaxRestartBackoff time.Duration
	// TokenTTL is the lifetime requested for service account tokens (renewed at 80%).
	TokenTTL time.Duration
	// StopGrace bounds each process's SIGTERM when the runner itself stops.
	StopGrace time.Duration
}

type runner struct {
	cfg      Config
	services cache.Indexer

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	wg      sync.WaitGroup
}

// Run runs pods until ctx ends; then every process is stopped (SIGTERM, StopGrace, SIGKILL) and
// its backends removed. The pods are left in the API server as a stopped kubelet leaves them.
func Run(ctx context.Context, cfg Config) error {
	if cfg.RestartBackoff <= 0 {
		cfg.RestartBackoff = time.Second
	}
	if cfg.MaxRestartBackoff < cfg.RestartBackoff {
		cfg.MaxRestartBackoff = 30 * time.Second
	}
	if cfg.TokenTTL < 10*time.Minute {
		cfg.TokenTTL = time.Hour
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = 5 * time.Second
	}
	for _, d := range []string{cfg.Dir, cfg.LogDir, cfg.ServicesDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	r := &runner{cfg: cfg, workers: map[types.UID]*podWorker{}}
	factory := informers.NewSharedInformerFactory(cfg.Client, 0)
	podInf := factory.Core().V1().Pods().Informer()
	svcInf := factory.Core().V1().Services().Informer()
	r.services = svcInf.GetIndexer()
	_, _ = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.podSeen(ctx, o) },
		UpdateFunc: func(_, o any) { r.podSeen(ctx, o) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if pod, ok := o.(*corev1.Pod); ok {
				r.podGone(pod.UID)
			}
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced, svcInf.HasSynced) {
		return ctx.Err()
	}
	log.Printf("pod runner: nodes %v, selector %q, %d image rules", keys(cfg.Nodes), cfg.Selector, len(cfg.Images))
	<-ctx.Done()
	factory.Shutdown()
	r.wg.Wait()
	return nil
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Mine reports whether a pod is one this runner runs as processes.
func (c Config) Mine(pod *corev1.Pod) bool {
	return c.Nodes[pod.Spec.NodeName] && c.Selector != nil && c.Selector.Matches(labels.Set(pod.Labels))
}

func (r *runner) podSeen(ctx context.Context, o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok || !r.cfg.Mine(pod) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[pod.UID]
	if w == nil {
		w = newPodWorker(r, pod)
		r.workers[pod.UID] = w
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			w.run(ctx)
			r.mu.Lock()
			delete(r.workers, pod.UID)
			r.mu.Unlock()
		}()
	}
	w.update(pod)
}

func (r *runner) podGone(uid types.UID) {
	r.mu.Lock()
	w := r.workers[uid]
	r.mu.Unlock()
	if w != nil {
		w.markGone()
	}
}

func (r *runner) servicesOf(ns string) []*corev1.Service {
	objs, _ := r.services.ByIndex(cache.NamespaceIndex, ns)
	out := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*corev1.Service); ok {
			out = append(out, s)
		}
	}
	return out
}

// freePort asks the kernel for a free 127.0.0.1 port.
func freePort() (int32, error) {
	l, err := net.Listen("tcp", LocalIP+":0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port), nil
}

func (r *runner) podDir(pod *corev1.Pod) string {
	return filepath.Join(r.cfg.Dir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID))
}

func (r *runner) logPath(pod *corev1.Pod) string {
	return filepath.Join(r.cfg.LogDir, fmt.Sprintf("pod-%s-%s.log", pod.Namespace, pod.Name))
}

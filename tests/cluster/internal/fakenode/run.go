package fakenode

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/utils/ptr"
)

// Config of a group of fake nodes.
type Config struct {
	Client kubernetes.Interface
	// NodeClient, if set, gives the client a node registers and writes its status with (a
	// kubelet's own identity, see NodeClient); nil: Client.
	NodeClient    func(name string) (kubernetes.Interface, error)
	Prefix        string
	Count         int
	StartIndex    int
	Shape         Shape
	StatusUpdate  time.Duration // kubelet nodeStatusUpdateFrequency
	StatusReport  time.Duration // kubelet nodeStatusReportFrequency
	LeaseDuration time.Duration // renewed every quarter, as the kubelet does
	SlowThreshold time.Duration
	MutatedAnno   string
	StatsFile     string
	StatsAddr     string
	RunPods       bool
	// PodFilter, if set, picks the pods RunPods marks Running (the rest are someone else's,
	// e.g. the pod runner's, which runs their processes).
	PodFilter    func(*corev1.Pod) bool
	DeleteOnExit bool
	// KubeletCert, if set, makes each node serve its resource metrics (GET /metrics/resource,
	// usage scripted by UsageAnnotation) over TLS with this certificate on its own 127.0.0.1
	// port, published in status.daemonEndpoints.kubeletEndpoint.port as a kubelet does.
	KubeletCert func(node string) (tls.Certificate, error)
}

// NodeClient is a client that acts as the node's kubelet does: user system:node:<name> in the
// group system:nodes (impersonated by base's user), so that the Node authorizer, NodeRestriction
// and admission match conditions on userInfo see a kubelet.
func NodeClient(base *rest.Config, name string) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(NodeRestConfig(base, name))
}

// NodeRestConfig is base impersonating the node's kubelet (see NodeClient).
func NodeRestConfig(base *rest.Config, name string) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:node:" + name,
		Groups:   []string{"system:nodes", "system:authenticated"},
	}
	return cfg
}

// NodeName is the name of the i-th node of a group.
func NodeName(prefix string, i int) string { return fmt.Sprintf("%s-%d", prefix, i) }

// Run keeps the nodes alive until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	box := &statsBox{s: Stats{
		Prefix: cfg.Prefix, Nodes: cfg.Count, PID: os.Getpid(), StartedAt: time.Now().UTC(),
		SlowThreshold: cfg.SlowThreshold.String(), PerNode: map[string]*NodeStats{},
	}}
	names := make(map[string]bool, cfg.Count)
	for i := 0; i < cfg.Count; i++ {
		n := NodeName(cfg.Prefix, cfg.StartIndex+i)
		names[n] = true
		box.s.PerNode[n] = &NodeStats{}
	}
	var wg sync.WaitGroup
	if cfg.StatsFile != "" {
		wg.Add(1)
		go func() { defer wg.Done(); publishStats(ctx, box, cfg.StatsFile) }()
	}
	if cfg.StatsAddr != "" {
		if err := serveStats(ctx, box, cfg.StatsAddr); err != nil {
			return err
		}
	}
	if cfg.RunPods {
		wg.Add(1)
		go func() { defer wg.Done(); runPods(ctx, cfg.Client, names, cfg.PodFilter, box) }()
	}
	ports := map[string]int{}
	if cfg.KubeletCert != nil {
		rm, err := newResourceMetrics(ctx, cfg.Client, names)
		if err != nil {
			return err
		}
		for name := range names {
			cert, err := cfg.KubeletCert(name)
			if err != nil {
				return fmt.Errorf("%s: serving certificate: %w", name, err)
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			ports[name] = l.Addr().(*net.TCPAddr).Port
			wg.Add(1)
			go func(name string) { defer wg.Done(); rm.serve(ctx, name, l, cert) }(name)
		}
	}
	for name := range names {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			k := &kubelet{cfg: cfg, client: cfg.Client, name: name, box: box, port: ports[name]}
			if cfg.NodeClient != nil {
				c, err := cfg.NodeClient(name)
				if err != nil {
					log.Printf("node %s: client: %v", name, err)
					return
				}
				k.client = c
			}
			k.run(ctx)
		}(name)
	}
	<-ctx.Done()
	wg.Wait()
	if cfg.DeleteOnExit {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for name := range names {
			_ = cfg.Client.CoreV1().Nodes().Delete(dctx, name, metav1.DeleteOptions{})
			_ = cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(dctx, name, metav1.DeleteOptions{})
		}
		cancel()
	}
	if cfg.StatsFile != "" {
		_ = writeStats(box, cfg.StatsFile)
	}
	return nil
}

type kubelet struct {
	cfg            Config
	client         kubernetes.Interface // registration and status writes (see Config.NodeClient)
	name           string
	box            *statsBox
	port           int // kubelet endpoint port (0: the kubelet's default, nothing listens)
	lastReportTime time.Time
}

// setStatus is SetStatus plus the port this kubelet serves on, if any.
func (k *kubelet) setStatus(n *corev1.Node, now metav1.Time) {
	SetStatus(n, k.cfg.Shape, now)
	if k.port != 0 {
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(k.port)
	}
}

func (k *kubelet) run(ctx context.Context) {
	// Register until it works (the kubelet retries registration with backoff).
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, 7*time.Second) {
		if k.register(ctx) {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	go k.leaseLoop(ctx)
	// Kubelets start at different times: spread the first status sync over one period.
	first := time.Duration(rand.Int64N(int64(k.cfg.StatusUpdate)))
	select {
	case <-ctx.Done():
		return
	case <-time.After(first):
	}
	t := time.NewTicker(k.cfg.StatusUpdate)
	defer t.Stop()
	for {
		k.syncNodeStatus(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (k *kubelet) register(ctx context.Context) bool {
	node := NewNode(k.name, k.cfg.Shape, metav1.Now())
	if k.port != 0 {
		node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(k.port)
	}
	start := time.Now()
	created, err := k.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	lat := time.Since(start)
	if apierrors.IsAlreadyExists(err) {
		// Registered by an earlier run: the status loop reconciles it, as the kubelet does.
		k.box.with(func(s *Stats) { s.Registrations.record(lat, k.cfg.SlowThreshold, nil, false, false, false) })
		return true
	}
	k.box.with(func(s *Stats) {
		s.Registrations.record(lat, k.cfg.SlowThreshold, err, err == nil && created.Annotations[k.cfg.MutatedAnno] != "",
			err == nil && !apiequality.Semantic.DeepEqual(created.Status.Allocatable, node.Status.Allocatable), false)
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Printf("register %s: %v", k.name, err)
		}
		return false
	}
	k.lastReportTime = time.Now()
	return true
}

// syncNodeStatus is the kubelet's updateNodeStatus: up to 5 tries of tryUpdateNodeStatus.
func (k *kubelet) syncNodeStatus(ctx context.Context) {
	for i := 0; i < 5; i++ {
		if ctx.Err() != nil {
			return
		}
		if err := k.tryUpdateNodeStatus(ctx, i); err == nil {
			return
		}
	}
}

func (k *kubelet) tryUpdateNodeStatus(ctx context.Context, try int) error {
	opts := metav1.GetOptions{}
	if try == 0 {
		// The kubelet's first try reads from the API server's cache.
		opts.ResourceVersion = "0"
	}
	node, err := k.client.CoreV1().Nodes().Get(ctx, k.name, opts)
	if err != nil {
		// A first read from the API server's cache may miss a node created a moment ago; the
		// next try reads from etcd. Like the kubelet, never register again once registered.
		k.box.with(func(s *Stats) { s.GetFailures++ })
		return err
	}
	original := node.DeepCopy()
	k.setStatus(node, metav1.Now())
	now := time.Now()
	if now.Before(k.lastReportTime.Add(k.cfg.StatusReport)) && !StatusChanged(&original.Status, &node.Status) {
		k.box.with(func(s *Stats) { s.Skipped++; s.PerNode[k.name].Skipped++ })
		return nil
	}
	start := time.Now()
	updated, _, err := nodeutil.PatchNodeStatus(k.client.CoreV1(), types.NodeName(k.name), original, node)
	lat := time.Since(start)
	mutated := err == nil && updated.Annotations[k.cfg.MutatedAnno] != ""
	overridden := err == nil && !apiequality.Semantic.DeepEqual(updated.Status.Allocatable, node.Status.Allocatable)
	k.box.with(func(s *Stats) {
		s.StatusWrites.record(lat, k.cfg.SlowThreshold, err, mutated, overridden, apierrors.IsConflict(err))
		ns := s.PerNode[k.name]
		ns.StatusWrites++
		if err != nil {
			ns.Failures++
		} else {
			ns.LastWrite = time.Now().UTC().Format(time.RFC3339Nano)
		}
		if mutated {
			ns.Mutated++
		}
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Printf("patch status %s: %v", k.name, err)
		}
		return err
	}
	k.lastReportTime = now
	return nil
}

// leaseLoop renews kube-node-lease/<node> every quarter of the lease duration.
func (k *kubelet) leaseLoop(ctx context.Context) {
	t := time.NewTicker(k.cfg.LeaseDuration / 4)
	defer t.Stop()
	for {
		err := k.renewLease(ctx)
		k.box.with(func(s *Stats) {
			if err != nil {
				s.LeaseFailures++
			} else {
				s.LeaseRenewals++
			}
		})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (k *kubelet) renewLease(ctx context.Context) error {
	leases := k.cfg.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, nerr := k.cfg.Client.CoreV1().Nodes().Get(ctx, k.name, metav1.GetOptions{})
		if nerr != nil {
			return nerr
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: k.name, Namespace: corev1.NamespaceNodeLease,
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: k.name, UID: node.UID,
				}},
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(k.name),
				LeaseDurationSeconds: ptr.To(int32(k.cfg.LeaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

func writeStats(box *statsBox, path string) error {
	data, err := json.MarshalIndent(box.snapshot(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func publishStats(ctx context.Context, box *statsBox, path string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if err := writeStats(box, path); err != nil {
			log.Printf("write stats: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func serveStats(ctx context.Context, box *statsBox, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || (host != "127.0.0.1" && host != "localhost") {
		return fmt.Errorf("--stats-addr %q must be 127.0.0.1:PORT", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(box.snapshot())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return nil
}

package fakenode

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// UsageAnnotation scripts the resource usage a fake kubelet reports on /metrics/resource: a
// JSON object {"cpu": QUANTITY, "memory": QUANTITY} (either may be left out = 0), e.g.
// {"cpu":"250m","memory":"100Mi"}. On a Pod it is the pod's usage (split evenly over its
// containers); on a Node it is usage outside pods (system daemons), added to the sum of its
// pods' usage. cpu is a rate in cores: the reported counters integrate it over time.
const UsageAnnotation = "kcp.overcommit.dev/usage"

// FreezeAnnotation on a Node ("true") makes its /metrics/resource serve the body it served
// last again, timestamps and all: a kubelet whose stats stopped updating. metrics-server then
// keeps listing the node's old sample.
const FreezeAnnotation = "kcp.overcommit.dev/freeze-metrics"

// Usage is a scripted usage: cpu in cores, memory in bytes.
type Usage struct {
	CPU, Memory float64
}

// ParseUsage reads a UsageAnnotation value. Empty means no usage.
func ParseUsage(s string) (Usage, error) {
	if s == "" {
		return Usage{}, nil
	}
	var raw map[string]string
	if err := json.Unmarshal([]byte(s), &raw); err != nil {
		return Usage{}, fmt.Errorf("%s: want a JSON object of quantities: %w", UsageAnnotation, err)
	}
	var u Usage
	for k, v := range raw {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return Usage{}, fmt.Errorf("%s: %s: %w", UsageAnnotation, k, err)
		}
		if q.Sign() < 0 {
			return Usage{}, fmt.Errorf("%s: %s %q is negative", UsageAnnotation, k, v)
		}
		switch k {
		case "cpu":
			u.CPU = float64(q.MilliValue()) / 1000
		case "memory":
			u.Memory = float64(q.Value())
		default:
			return Usage{}, fmt.Errorf("%s: unknown resource %q (cpu, memory)", UsageAnnotation, k)
		}
	}
	return u, nil
}

// counter is a cumulative cpu counter (core-seconds) growing at rate (cores) since last.
type counter struct {
	total, rate float64
	last        time.Time
}

// advance integrates the rate up to now, then sets the new rate.
func (c *counter) advance(now time.Time, rate float64) {
	if now.After(c.last) {
		c.total += c.rate * now.Sub(c.last).Seconds()
		c.last = now
	}
	c.rate = rate
}

type containerKey struct {
	namespace, pod, uid, container string
}

// resourceMetrics keeps the usage counters of one fake-nodes process's nodes and renders each
// node's /metrics/resource as the kubelet does (the metrics of pkg/kubelet/metrics/collectors
// resource_metrics.go, Prometheus text format with timestamps).
type resourceMetrics struct {
	nodes    map[string]bool
	pods     cache.Indexer
	nodeObjs cache.Indexer

	mu         sync.Mutex
	nodeCPU    map[string]*counter
	containers map[containerKey]*counter
	badUsage   map[string]string // object key -> the last annotation that did not parse (logged once)
	served     map[string][]byte // node -> the body last rendered (served again while frozen)
}

const podsByNode = "node"

func newResourceMetrics(ctx context.Context, client kubernetes.Interface, nodes map[string]bool) (*resourceMetrics, error) {
	m := &resourceMetrics{nodes: nodes, nodeCPU: map[string]*counter{}, containers: map[containerKey]*counter{}, badUsage: map[string]string{}, served: map[string][]byte{}}
	factory := informers.NewSharedInformerFactory(client, 0)
	podInf := factory.Core().V1().Pods().Informer()
	if err := podInf.AddIndexers(cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	nodeInf := factory.Core().V1().Nodes().Informer()
	m.pods, m.nodeObjs = podInf.GetIndexer(), nodeInf.GetIndexer()
	// Every change of a rate integrates the counters up to that moment with the old rates.
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.sync(time.Now()) },
		UpdateFunc: func(any, any) { m.sync(time.Now()) },
		DeleteFunc: func(any) { m.sync(time.Now()) },
	}
	if _, err := podInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	if _, err := nodeInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	return m, nil
}

func (m *resourceMetrics) usage(kind, key, value string) Usage {
	u, err := ParseUsage(value)
	if err != nil {
		if m.badUsage[key] != value {
			log.Printf("%s %s: %v (counted as no usage)", kind, key, err)
			m.badUsage[key] = value
		}
		return Usage{}
	}
	delete(m.badUsage, key)
	return u
}

// nodeUsage is the usage the Node's own annotation scripts (outside its pods).
func (m *resourceMetrics) nodeUsage(node string) Usage {
	if o, ok, _ := m.nodeObjs.GetByKey(node); ok {
		if n, ok := o.(*corev1.Node); ok {
			return m.usage("node", node, n.Annotations[UsageAnnotation])
		}
	}
	return Usage{}
}

func (m *resourceMetrics) podUsage(p *corev1.Pod) Usage {
	return m.usage("pod", p.Namespace+"/"+p.Name, p.Annotations[UsageAnnotation])
}

// runningPods are the pods of node that a kubelet reports: bound there and not terminated.
func (m *resourceMetrics) runningPods(node string) []*corev1.Pod {
	objs, _ := m.pods.ByIndex(podsByNode, node)
	var out []*corev1.Pod
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || len(p.Spec.Containers) == 0 {
			continue
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// sync integrates every counter up to now and takes the rates the annotations script now.
func (m *resourceMetrics) sync(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := map[containerKey]bool{}
	for node := range m.nodes {
		nodeRate := m.nodeUsage(node).CPU
		for _, p := range m.runningPods(node) {
			u := m.podUsage(p)
			nodeRate += u.CPU
			for _, c := range p.Spec.Containers {
				k := containerKey{p.Namespace, p.Name, string(p.UID), c.Name}
				seen[k] = true
				ctr := m.containers[k]
				if ctr == nil {
					ctr = &counter{last: now}
					m.containers[k] = ctr
				}
				ctr.advance(now, u.CPU/float64(len(p.Spec.Containers)))
			}
		}
		ctr := m.nodeCPU[node]
		if ctr == nil {
			ctr = &counter{last: now}
			m.nodeCPU[node] = ctr
		}
		ctr.advance(now, nodeRate)
	}
	for k := range m.containers {
		if !seen[k] {
			delete(m.containers, k)
		}
	}
}

// frozen reports whether node's FreezeAnnotation is "true".
func (m *resourceMetrics) frozen(node string) bool {
	if o, ok, _ := m.nodeObjs.GetByKey(node); ok {
		if n, ok := o.(*corev1.Node); ok {
			return n.Annotations[FreezeAnnotation] == "true"
		}
	}
	return false
}

// render writes node's resource metrics at now, in the kubelet's text format (or, while the
// node is frozen, the body served last).
func (m *resourceMetrics) render(node string, now time.Time) ([]byte, error) {
	m.sync(now)
	m.mu.Lock()
	defer m.mu.Unlock()
	if last, ok := m.served[node]; ok && m.frozen(node) {
		return last, nil
	}
	ts := now.UnixMilli()
	sample := func(v float64, labels ...string) *dto.Metric {
		out := &dto.Metric{Untyped: &dto.Untyped{Value: ptr.To(v)}, TimestampMs: ptr.To(ts)}
		for i := 0; i+1 < len(labels); i += 2 {
			out.Label = append(out.Label, &dto.LabelPair{Name: ptr.To(labels[i]), Value: ptr.To(labels[i+1])})
		}
		return out
	}
	fam := func(name, help string, t dto.MetricType, ms []*dto.Metric) *dto.MetricFamily {
		for _, s := range ms {
			v := s.Untyped.GetValue()
			s.Untyped = nil
			if t == dto.MetricType_COUNTER {
				s.Counter = &dto.Counter{Value: ptr.To(v)}
			} else {
				s.Gauge = &dto.Gauge{Value: ptr.To(v)}
			}
		}
		return &dto.MetricFamily{Name: ptr.To(name), Help: ptr.To("[STABLE] " + help), Type: t.Enum(), Metric: ms}
	}
	var cCPU, cMem, cStart, pCPU, pMem []*dto.Metric
	nodeMem := m.nodeUsage(node).Memory
	for _, p := range m.runningPods(node) {
		u := m.podUsage(p)
		nodeMem += u.Memory
		started := map[string]time.Time{}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running != nil {
				started[s.Name] = s.State.Running.StartedAt.Time
			}
		}
		podCPU := 0.0
		for _, c := range p.Spec.Containers {
			ctr := m.containers[containerKey{p.Namespace, p.Name, string(p.UID), c.Name}]
			if ctr == nil {
				continue
			}
			podCPU += ctr.total
			labels := []string{"container", c.Name, "namespace", p.Namespace, "pod", p.Name}
			cCPU = append(cCPU, sample(ctr.total, labels...))
			cMem = append(cMem, sample(u.Memory/float64(len(p.Spec.Containers)), labels...))
			start, ok := started[c.Name]
			if !ok && p.Status.StartTime != nil {
				start = p.Status.StartTime.Time
			}
			if !start.IsZero() {
				cStart = append(cStart, sample(float64(start.UnixNano())/1e9, labels...))
			}
		}
		pCPU = append(pCPU, sample(podCPU, "namespace", p.Namespace, "pod", p.Name))
		pMem = append(pMem, sample(u.Memory, "namespace", p.Namespace, "pod", p.Name))
	}
	nodeCPU := 0.0
	if ctr := m.nodeCPU[node]; ctr != nil {
		nodeCPU = ctr.total
	}
	families := []*dto.MetricFamily{
		fam("container_cpu_usage_seconds_total", "Cumulative cpu time consumed by the container in core-seconds", dto.MetricType_COUNTER, cCPU),
		fam("container_memory_working_set_bytes", "Current working set of the container in bytes", dto.MetricType_GAUGE, cMem),
		fam("container_start_time_seconds", "Start time of the container since unix epoch in seconds", dto.MetricType_GAUGE, cStart),
		fam("node_cpu_usage_seconds_total", "Cumulative cpu time consumed by the node in core-seconds", dto.MetricType_COUNTER, []*dto.Metric{sample(nodeCPU)}),
		fam("node_memory_working_set_bytes", "Current working set of the node in bytes", dto.MetricType_GAUGE, []*dto.Metric{sample(nodeMem)}),
		fam("pod_cpu_usage_seconds_total", "Cumulative cpu time consumed by the pod in core-seconds", dto.MetricType_COUNTER, pCPU),
		fam("pod_memory_working_set_bytes", "Current working set of the pod in bytes", dto.MetricType_GAUGE, pMem),
	}
	scrapeErr := fam("resource_scrape_error", "1 if there was an error while getting container metrics, 0 otherwise", dto.MetricType_GAUGE, []*dto.Metric{sample(0)})
	scrapeErr.Metric[0].TimestampMs = nil
	families = append(families, scrapeErr)
	var buf bytes.Buffer
	for _, f := range families {
		if len(f.Metric) == 0 {
			continue
		}
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			return nil, err
		}
	}
	if m.served == nil {
		m.served = map[string][]byte{}
	}
	m.served[node] = buf.Bytes()
	return buf.Bytes(), nil
}

// serveResourceMetrics serves GET /metrics/resource of node over TLS on l until ctx ends.
// Clients are not authenticated (a kubelet would check them with TokenReview/SubjectAccessReview).
func (m *resourceMetrics) serve(ctx context.Context, node string, l net.Listener, cert tls.Certificate) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics/resource", func(w http.ResponseWriter, _ *http.Request) {
		body, err := m.render(node, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
		_, _ = w.Write(body)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.ServeTLS(l, "", ""); err != nil && err != http.ErrServerClosed && ctx.Err() == nil {
		log.Printf("%s: /metrics/resource: %v", node, err)
	}
}

package deploytest

// The alert on requests above the real allocatable, evaluated by the Prometheus query engine
// (github.com/prometheus/prometheus/promql) against synthetic series, exactly as rendered from
// the kustomize component and from the Helm chart. The series live in a small in-memory
// storage.Queryable (below): promqltest's TSDB-backed storage would pull Prometheus' whole
// configuration package (AWS, Azure and GCP SDKs) into this module's build.

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	promqlengine "github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

const gi = 1 << 30

// alertNode is a node as kube-state-metrics sees it (allocatable as stored, inflated where a
// policy applies) and, when inflated, as the kube-overcommit leader exports it (the raw value).
type alertNode struct {
	name   string
	stored map[string]float64 // kube_node_status_allocatable
	raw    map[string]float64 // kube_overcommit_node_raw_allocatable; nil: not inflated
}

// alertPod is a pod of one container bound to a node.
type alertPod struct {
	name, node, phase string
	requests          map[string]float64
}

var requestsAlertNodes = []alertNode{
	// cpu inflated 4 -> 8, requests 4.5: 112.5% of raw -> fires (KSM's 8 alone would not);
	// memory not inflated (KSM's value), requests 1Gi of 16Gi -> does not fire.
	{"inflated-over", map[string]float64{"cpu": 8, "memory": 16 * gi}, map[string]float64{"cpu": 4}},
	// cpu inflated 10 -> 20, requests 11: exactly 110% -> does not fire.
	{"inflated-at", map[string]float64{"cpu": 20}, map[string]float64{"cpu": 10}},
	// cpu 4 -> 8, requests 4: 100%; memory 16Gi -> 32Gi, requests 18Gi: 112.5% -> fires for memory.
	{"inflated-under", map[string]float64{"cpu": 8, "memory": 32 * gi, "pods": 110}, map[string]float64{"cpu": 4, "memory": 16 * gi}},
	// The policy was deleted: no annotation, no series of ours, KSM shows the kubelet's 4 cpu and
	// 8Gi; the pods bound while the node looked larger request 6 cpu and 12Gi -> fires for both.
	{"deflated", map[string]float64{"cpu": 4, "memory": 8 * gi}, nil},
	// Never inflated: 4 cpu, requests 4 by a running pod, 8 more by a Succeeded one (not
	// counted) -> does not fire.
	{"plain", map[string]float64{"cpu": 4}, nil},
}

var requestsAlertPods = []alertPod{
	{"over-1", "inflated-over", "Running", map[string]float64{"cpu": 2, "memory": 1 * gi}},
	{"over-2", "inflated-over", "Pending", map[string]float64{"cpu": 2.5}},
	{"at-1", "inflated-at", "Running", map[string]float64{"cpu": 11}},
	{"under-1", "inflated-under", "Running", map[string]float64{"cpu": 4, "memory": 18 * gi}},
	{"defl-1", "deflated", "Running", map[string]float64{"cpu": 3, "memory": 6 * gi}},
	{"defl-2", "deflated", "Running", map[string]float64{"cpu": 3, "memory": 6 * gi}},
	{"plain-1", "plain", "Running", map[string]float64{"cpu": 4}},
	{"plain-done", "plain", "Succeeded", map[string]float64{"cpu": 8}},
}

// requestsAlertSeries: the series kube-state-metrics and the leader export for the nodes and
// pods above, one sample each at `at`. Every pod has a kube_pod_status_phase series per phase,
// 1 for its own, as kube-state-metrics writes them.
func requestsAlertSeries(at time.Time) memSeries {
	var out memSeries
	add := func(v float64, nameAndLabels ...string) {
		s := []chunks.Sample{floatSample{t: at.UnixMilli(), f: v}}
		out = append(out, storage.NewListSeries(labels.FromStrings(append([]string{"__name__"}, nameAndLabels...)...), s))
	}
	unit := map[string]string{"cpu": "core", "memory": "byte", "pods": "integer"}
	for _, n := range requestsAlertNodes {
		for res, v := range n.stored {
			add(v, "kube_node_status_allocatable", "node", n.name, "resource", res, "unit", unit[res])
		}
		for res, v := range n.raw {
			add(v, "kube_overcommit_node_raw_allocatable", "node", n.name, "resource", res, "unit", unit[res], "pod", "kube-overcommit-0")
		}
	}
	for _, p := range requestsAlertPods {
		for res, v := range p.requests {
			add(v, "kube_pod_container_resource_requests", "namespace", "a", "pod", p.name, "container", "c", "node", p.node, "resource", res, "unit", unit[res])
		}
		for _, phase := range []string{"Pending", "Running", "Succeeded", "Failed", "Unknown"} {
			v := 0.0
			if phase == p.phase {
				v = 1
			}
			add(v, "kube_pod_status_phase", "namespace", "a", "pod", p.name, "phase", phase)
		}
	}
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	return out
}

// The alerts expected: node/resource -> the ratio of requests to the real allocatable.
var requestsAlertWant = map[string]float64{
	"inflated-over/cpu":     4.5 / 4,
	"inflated-under/memory": 18.0 / 16,
	"deflated/cpu":          6.0 / 4,
	"deflated/memory":       12.0 / 8,
}

func TestStaticRequestsAlertEvaluates(t *testing.T) {
	r := render(t)
	series := requestsAlertSeries(time.Unix(0, 0))
	engine := promqlengine.NewEngine(promqlengine.EngineOpts{MaxSamples: 1_000_000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	at := time.Unix(0, 0).Add(time.Minute)
	for what, objs := range map[string]*monitoringv1.PrometheusRule{
		"kustomize": convert[monitoringv1.PrometheusRule](t, mustFind(t, r.production, "PrometheusRule", "kube-overcommit")),
		"helm":      convert[monitoringv1.PrometheusRule](t, mustFind(t, r.helmAll, "PrometheusRule", "kube-overcommit")),
	} {
		expr := ""
		for _, g := range objs.Spec.Groups {
			for _, rule := range g.Rules {
				if rule.Alert == "KubeOvercommitNodeRequestsAboveRawAllocatable" {
					expr = exprOf(rule.Expr)
				}
			}
		}
		if expr == "" {
			t.Fatalf("%s: no alert KubeOvercommitNodeRequestsAboveRawAllocatable", what)
		}
		got, err := evalInstant(engine, series, expr, at)
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, expr)
		}
		if fmt.Sprint(sortedKeys(got)) != fmt.Sprint(sortedKeys(requestsAlertWant)) {
			t.Errorf("%s: fires for %v, want %v\n%s", what, got, requestsAlertWant, expr)
			continue
		}
		for k, want := range requestsAlertWant {
			if d := got[k] - want; d > 1e-9 || d < -1e-9 {
				t.Errorf("%s: %s at %v, want %v", what, k, got[k], want)
			}
		}
		t.Logf("%s: fires for %v", what, got)
	}
}

// evalInstant runs an instant query and returns node/resource -> value.
func evalInstant(engine *promqlengine.Engine, series storage.Queryable, expr string, at time.Time) (map[string]float64, error) {
	q, err := engine.NewInstantQuery(context.Background(), series, nil, expr, at)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		return nil, res.Err
	}
	vec, err := res.Vector()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range vec {
		out[s.Metric.Get("node")+"/"+s.Metric.Get("resource")] = s.F
	}
	return out, nil
}

func sortedKeys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// memSeries: series of one float sample each, selected by matchers. Enough for instant queries
// without range selectors.
type memSeries []storage.Series

func (m memSeries) Querier(int64, int64) (storage.Querier, error) { return m, nil }

func (m memSeries) Select(_ context.Context, _ bool, _ *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
	var sel memSeries
	for _, s := range m {
		ok := true
		for _, mt := range matchers {
			ok = ok && mt.Matches(s.Labels().Get(mt.Name))
		}
		if ok {
			sel = append(sel, s)
		}
	}
	return &memSeriesSet{series: sel, i: -1}
}

func (memSeries) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (memSeries) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (memSeries) Close() error { return nil }

type memSeriesSet struct {
	series memSeries
	i      int
}

func (s *memSeriesSet) Next() bool                      { s.i++; return s.i < len(s.series) }
func (s *memSeriesSet) At() storage.Series              { return s.series[s.i] }
func (*memSeriesSet) Err() error                        { return nil }
func (*memSeriesSet) Warnings() annotations.Annotations { return nil }

type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }

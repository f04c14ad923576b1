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
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	promqlengine "github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// requestsAlertSeries: what kube-state-metrics and the kube-overcommit leader export for five
// nodes, one sample each.
//
//	inflated-over   cpu raw 4, inflated to 8 (KSM shows 8), requests 4.5: 112.5% of raw -> fires
//	inflated-at     cpu raw 10, inflated to 20, requests 11: exactly 110% -> does not fire
//	inflated-under  cpu raw 4, inflated to 8, requests 4; memory raw 16Gi (our metric) and
//	                requests 18Gi: 112.5% -> fires for memory only
//	deflated        no annotation any more (policy deleted): no series of ours, KSM shows the
//	                kubelet's 4 cpu, the pods bound while it was inflated request 6 -> fires
//	plain           never inflated: KSM 4 cpu, requests 4 by a running pod plus 8 by a
//	                Succeeded one (not counted) -> does not fire
const requestsAlertSeries = `
kube_node_status_allocatable{node="inflated-over",resource="cpu",unit="core"}                  8
kube_node_status_allocatable{node="inflated-over",resource="memory",unit="byte"}               17179869184
kube_node_status_allocatable{node="inflated-at",resource="cpu",unit="core"}                    20
kube_node_status_allocatable{node="inflated-under",resource="cpu",unit="core"}                 8
kube_node_status_allocatable{node="inflated-under",resource="memory",unit="byte"}              34359738368
kube_node_status_allocatable{node="inflated-under",resource="pods",unit="integer"}             110
kube_node_status_allocatable{node="deflated",resource="cpu",unit="core"}                       4
kube_node_status_allocatable{node="plain",resource="cpu",unit="core"}                          4
kube_overcommit_node_raw_allocatable{node="inflated-over",resource="cpu",unit="core",pod="ko-1"}       4
kube_overcommit_node_raw_allocatable{node="inflated-at",resource="cpu",unit="core",pod="ko-1"}         10
kube_overcommit_node_raw_allocatable{node="inflated-under",resource="cpu",unit="core",pod="ko-1"}      4
kube_overcommit_node_raw_allocatable{node="inflated-under",resource="memory",unit="byte",pod="ko-1"}   17179869184
kube_pod_container_resource_requests{namespace="a",pod="over-1",container="c",node="inflated-over",resource="cpu",unit="core"}   2
kube_pod_container_resource_requests{namespace="a",pod="over-2",container="c",node="inflated-over",resource="cpu",unit="core"}   2.5
kube_pod_container_resource_requests{namespace="a",pod="over-1",container="c",node="inflated-over",resource="memory",unit="byte"} 1073741824
kube_pod_container_resource_requests{namespace="a",pod="at-1",container="c",node="inflated-at",resource="cpu",unit="core"}       11
kube_pod_container_resource_requests{namespace="a",pod="under-1",container="c",node="inflated-under",resource="cpu",unit="core"} 4
kube_pod_container_resource_requests{namespace="a",pod="under-1",container="c",node="inflated-under",resource="memory",unit="byte"}  19327352832
kube_pod_container_resource_requests{namespace="a",pod="defl-1",container="c",node="deflated",resource="cpu",unit="core"}        3
kube_pod_container_resource_requests{namespace="a",pod="defl-1",container="d",node="deflated",resource="cpu",unit="core"}        3
kube_pod_container_resource_requests{namespace="a",pod="plain-1",container="c",node="plain",resource="cpu",unit="core"}         4
kube_pod_container_resource_requests{namespace="a",pod="plain-done",container="c",node="plain",resource="cpu",unit="core"}      8
kube_pod_status_phase{namespace="a",pod="over-1",phase="Running"}     1
kube_pod_status_phase{namespace="a",pod="over-1",phase="Succeeded"}   0
kube_pod_status_phase{namespace="a",pod="over-2",phase="Pending"}     1
kube_pod_status_phase{namespace="a",pod="at-1",phase="Running"}       1
kube_pod_status_phase{namespace="a",pod="under-1",phase="Running"}    1
kube_pod_status_phase{namespace="a",pod="defl-1",phase="Running"}     1
kube_pod_status_phase{namespace="a",pod="plain-1",phase="Running"}    1
kube_pod_status_phase{namespace="a",pod="plain-done",phase="Running"} 0
kube_pod_status_phase{namespace="a",pod="plain-done",phase="Succeeded"} 1
`

// The alerts expected: node/resource -> the ratio of requests to the real allocatable.
var requestsAlertWant = map[string]float64{
	"inflated-over/cpu":     4.5 / 4,
	"inflated-under/memory": 18.0 / 16,
	"deflated/cpu":          6.0 / 4,
}

func TestStaticRequestsAlertEvaluates(t *testing.T) {
	r := render(t)
	series, err := parseSeries(requestsAlertSeries, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
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

// parseSeries reads lines `metric{labels} value` into series with one sample at `at`.
func parseSeries(text string, at time.Time) (memSeries, error) {
	var out memSeries
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		i := strings.LastIndexAny(line, " \t")
		if i < 0 {
			return nil, fmt.Errorf("no value: %q", line)
		}
		lbls, err := parser.ParseMetric(strings.TrimSpace(line[:i]))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out = append(out, storage.NewListSeries(lbls, []chunks.Sample{floatSample{t: at.UnixMilli(), f: v}}))
	}
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	return out, nil
}

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

package fakenode

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

func TestParseUsage(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Usage
		wantErr bool
	}{
		{"", Usage{}, false},
		{`{}`, Usage{}, false},
		{`{"cpu":"250m","memory":"100Mi"}`, Usage{CPU: 0.25, Memory: 100 << 20}, false},
		{`{"cpu":"2"}`, Usage{CPU: 2}, false},
		{`{"memory":"1Gi"}`, Usage{Memory: 1 << 30}, false},
		{`{"cpu":"-1"}`, Usage{}, true},
		{`{"cpu":"lots"}`, Usage{}, true},
		{`{"gpu":"1"}`, Usage{}, true},
		{`{"cpu":1}`, Usage{}, true},
		{`cpu=1`, Usage{}, true},
	} {
		got, err := ParseUsage(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseUsage(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// The cpu counters integrate the scripted rate over time: a rate change counts from the
// moment it is seen.
func TestCounterIntegratesRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &counter{last: t0}
	c.advance(t0, 0.5)
	c.advance(t0.Add(10*time.Second), 2) // 10 s at 0.5
	c.advance(t0.Add(15*time.Second), 2) // 5 s at 2
	c.advance(t0.Add(14*time.Second), 1) // the past: no change of the total
	c.advance(t0.Add(16*time.Second), 1) // 1 s at 1 (the rate set just before)
	if want := 5.0 + 10 + 1; math.Abs(c.total-want) > 1e-9 {
		t.Fatalf("total %v, want %v", c.total, want)
	}
}

// render writes the kubelet's resource metrics: node and per-container/pod series with
// timestamps, usage from the annotations, node = its pods + its own annotation.
func TestRenderResourceMetrics(t *testing.T) {
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}})
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	started := time.Unix(2000, 0)
	mk := func(name, node, usage, phase string, containers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			Annotations: map[string]string{UsageAnnotation: usage}}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodPhase(phase), StartTime: &metav1.Time{Time: started}}}
		for _, c := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
		}
		return p
	}
	for _, p := range []*corev1.Pod{
		mk("a", "n0", `{"cpu":"1","memory":"100Mi"}`, "Running", "app", "side"),
		mk("b", "n0", `{"cpu":"500m","memory":"50Mi"}`, "Running", "app"),
		mk("done", "n0", `{"cpu":"4","memory":"1Gi"}`, "Succeeded", "app"),
		mk("bad", "n0", `not json`, "Running", "app"),
		mk("other", "n1", `{"cpu":"3","memory":"3Gi"}`, "Running", "app"),
	} {
		if err := pods.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := nodes.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n0",
		Annotations: map[string]string{UsageAnnotation: `{"cpu":"250m","memory":"1Gi"}`}}}); err != nil {
		t.Fatal(err)
	}
	m := &resourceMetrics{nodes: map[string]bool{"n0": true, "n1": true}, pods: pods, nodeObjs: nodes,
		nodeCPU: map[string]*counter{}, containers: map[containerKey]*counter{}, badUsage: map[string]string{}}
	t0 := time.Unix(3000, 0)
	m.sync(t0)
	body, err := m.render("n0", t0.Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no %s in\n%s", name, body)
		}
	next:
		for _, s := range f.Metric {
			if s.GetTimestampMs() != t0.Add(10*time.Second).UnixMilli() && name != "resource_scrape_error" {
				t.Errorf("%s: timestamp %d", name, s.GetTimestampMs())
			}
			got := map[string]string{}
			for _, l := range s.Label {
				got[l.GetName()] = l.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if s.Counter != nil {
				return s.Counter.GetValue()
			}
			return s.Gauge.GetValue()
		}
		t.Fatalf("no %s%v in\n%s", name, labels, body)
		return 0
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	ctr := func(pod, c string) map[string]string {
		return map[string]string{"namespace": "ns", "pod": pod, "container": c}
	}
	// 10 s at 1.75 cores (a 1 + b 0.5 + node 0.25; "done" terminated, "bad" unparsable = 0).
	near("node cpu", value("node_cpu_usage_seconds_total", nil), 17.5)
	near("node memory", value("node_memory_working_set_bytes", nil), float64(150<<20+1<<30))
	near("a/app cpu", value("container_cpu_usage_seconds_total", ctr("a", "app")), 5)
	near("a/side memory", value("container_memory_working_set_bytes", ctr("a", "side")), 50<<20)
	near("a start", value("container_start_time_seconds", ctr("a", "app")), 2000)
	near("pod a cpu", value("pod_cpu_usage_seconds_total", map[string]string{"namespace": "ns", "pod": "a"}), 10)
	near("pod b memory", value("pod_memory_working_set_bytes", map[string]string{"namespace": "ns", "pod": "b"}), 50<<20)
	near("scrape error", value("resource_scrape_error", nil), 0)
	for _, s := range fams["container_cpu_usage_seconds_total"].Metric {
		for _, l := range s.Label {
			if l.GetName() == "pod" && (l.GetValue() == "done" || l.GetValue() == "other") {
				t.Errorf("series of pod %s on n0", l.GetValue())
			}
		}
	}
	if fams["container_cpu_usage_seconds_total"].GetType().String() != "COUNTER" || fams["node_memory_working_set_bytes"].GetType().String() != "GAUGE" {
		t.Errorf("metric types: %s", body)
	}
}

// A frozen node serves its last body again (old timestamps and all), until thawed.
func TestFrozenNodeServesItsLastBody(t *testing.T) {
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}})
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n0",
		Annotations: map[string]string{UsageAnnotation: `{"cpu":"1","memory":"1Gi"}`}}}
	if err := nodes.Add(node); err != nil {
		t.Fatal(err)
	}
	m := &resourceMetrics{nodes: map[string]bool{"n0": true}, pods: pods, nodeObjs: nodes,
		nodeCPU: map[string]*counter{}, containers: map[containerKey]*counter{}, badUsage: map[string]string{}}
	t0 := time.Unix(3000, 0)
	render := func(at time.Time) string {
		t.Helper()
		body, err := m.render("n0", at)
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
	first := render(t0)
	frozen := node.DeepCopy()
	frozen.Annotations[FreezeAnnotation] = "true"
	if err := nodes.Update(frozen); err != nil {
		t.Fatal(err)
	}
	if again := render(t0.Add(10 * time.Second)); again != first {
		t.Fatalf("frozen: body changed\n%s\nthen\n%s", first, again)
	}
	if err := nodes.Update(node); err != nil {
		t.Fatal(err)
	}
	thawed := render(t0.Add(20 * time.Second))
	if thawed == first || !strings.Contains(thawed, fmt.Sprint(t0.Add(20*time.Second).UnixMilli())) {
		t.Fatalf("thawed: body not renewed\n%s", thawed)
	}
}

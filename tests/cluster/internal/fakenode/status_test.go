package fakenode

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func shape() Shape {
	rl := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	return Shape{Capacity: rl, Allocatable: rl.DeepCopy(), Images: 50}
}

func TestStatusChanged(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	stored := NewNode("n", shape(), t0)
	cases := []struct {
		name   string
		mutate func(*corev1.Node)
		want   bool
	}{
		{"only heartbeat newer", func(n *corev1.Node) {}, false},
		{"allocatable inflated by a webhook", func(n *corev1.Node) {
			n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("16")
		}, true},
		{"condition flipped", func(n *corev1.Node) { n.Status.Conditions[3].Status = corev1.ConditionFalse }, true},
		{"image list differs", func(n *corev1.Node) { n.Status.Images = n.Status.Images[1:] }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			old := stored.DeepCopy()
			c.mutate(old)
			computed := old.DeepCopy()
			SetStatus(computed, shape(), metav1.NewTime(t0.Add(10*time.Second)))
			if got := StatusChanged(&old.Status, &computed.Status); got != c.want {
				t.Fatalf("StatusChanged = %v, want %v", got, c.want)
			}
		})
	}
}

func TestSetStatusKeepsTransitionTime(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	n := NewNode("n", shape(), t0)
	t1 := metav1.NewTime(t0.Add(time.Minute))
	SetStatus(n, shape(), t1)
	for _, c := range n.Status.Conditions {
		if !c.LastTransitionTime.Equal(&t0) || !c.LastHeartbeatTime.Equal(&t1) {
			t.Errorf("%s: transition %v heartbeat %v", c.Type, c.LastTransitionTime, c.LastHeartbeatTime)
		}
	}
	if len(n.Status.Images) != 50 || n.Status.Images[0].SizeBytes < n.Status.Images[49].SizeBytes {
		t.Errorf("images not 50 sorted by size")
	}
}

func TestScriptedConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(1000, 0))
	stored := NewNode("n", shape(), t0)
	condition := func(n *corev1.Node, kind corev1.NodeConditionType) corev1.NodeCondition {
		for _, c := range n.Status.Conditions {
			if c.Type == kind {
				return c
			}
		}
		t.Fatalf("no %s condition", kind)
		return corev1.NodeCondition{}
	}
	cases := []struct {
		name, annotation string
		want             map[corev1.NodeConditionType]corev1.ConditionStatus
		reason           string // of MemoryPressure
	}{
		{"none", "", nil, "KubeletHasSufficientMemory"},
		{"memory pressure", `{"MemoryPressure":"True"}`,
			map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeMemoryPressure: corev1.ConditionTrue}, "KubeletHasInsufficientMemory"},
		{"not ready and disk pressure", `{"Ready":"False","DiskPressure":"True"}`,
			map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeReady: corev1.ConditionFalse, corev1.NodeDiskPressure: corev1.ConditionTrue}, "KubeletHasSufficientMemory"},
		{"status a kubelet never reports", `{"MemoryPressure":"Unknown","Ready":"Maybe"}`, nil, "KubeletHasSufficientMemory"},
		{"not an object", `MemoryPressure=True`, nil, "KubeletHasSufficientMemory"},
	}
	healthy := map[corev1.NodeConditionType]corev1.ConditionStatus{
		corev1.NodeMemoryPressure: corev1.ConditionFalse, corev1.NodeDiskPressure: corev1.ConditionFalse,
		corev1.NodePIDPressure: corev1.ConditionFalse, corev1.NodeReady: corev1.ConditionTrue,
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := stored.DeepCopy()
			if c.annotation != "" {
				n.Annotations[ConditionsAnnotation] = c.annotation
			}
			t1 := metav1.NewTime(t0.Add(10 * time.Second))
			SetStatus(n, shape(), t1)
			for kind, want := range healthy {
				if s, ok := c.want[kind]; ok {
					want = s
				}
				got := condition(n, kind)
				if got.Status != want || !got.LastHeartbeatTime.Equal(&t1) {
					t.Errorf("%s: status %s heartbeat %v, want %s at %v", kind, got.Status, got.LastHeartbeatTime, want, t1)
				}
				// A changed status is a transition now; an unchanged one keeps its time.
				wantTransition := t0
				if want != healthy[kind] {
					wantTransition = t1
				}
				if !got.LastTransitionTime.Equal(&wantTransition) {
					t.Errorf("%s: transition %v, want %v", kind, got.LastTransitionTime, wantTransition)
				}
			}
			if got := condition(n, corev1.NodeMemoryPressure).Reason; got != c.reason {
				t.Errorf("MemoryPressure reason %q, want %q", got, c.reason)
			}
			if changed := StatusChanged(&stored.Status, &n.Status); changed != (len(c.want) > 0) {
				t.Errorf("StatusChanged = %v with %d scripted changes", changed, len(c.want))
			}
		})
	}
}

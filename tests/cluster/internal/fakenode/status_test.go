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

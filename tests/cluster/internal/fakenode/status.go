// Package fakenode runs fake kubelets: each registers its Node, keeps its status the way the
// kubelet's node status loop does (read, compute, strategic-merge PATCH only when changed or
// when the report interval passed) and renews its Lease. Every status write is counted.
package fakenode

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Shape is what a fake node reports about itself.
type Shape struct {
	Capacity    corev1.ResourceList
	Allocatable corev1.ResourceList
	Labels      map[string]string
	Images      int
}

// imageList builds n deterministic container images, largest first, as the kubelet reports
// them (it sorts by size and reports at most 50 by default).
func imageList(n int) []corev1.ContainerImage {
	out := make([]corev1.ContainerImage, 0, n)
	for i := 0; i < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("kcp-fake-image-%d", i)))
		name := fmt.Sprintf("registry.example.invalid/kcp/fake-image-%02d", i)
		out = append(out, corev1.ContainerImage{
			Names:     []string{name + "@sha256:" + hex.EncodeToString(sum[:]), fmt.Sprintf("%s:v1.%d.0", name, i)},
			SizeBytes: int64(1_000_000_000 - i*15_000_000),
		})
	}
	return out
}

// NewNode is the object a kubelet creates when it registers: metadata plus a first status.
func NewNode(name string, shape Shape, now metav1.Time) *corev1.Node {
	labels := map[string]string{
		"kubernetes.io/hostname":       name,
		"kubernetes.io/os":             "linux",
		"kubernetes.io/arch":           "amd64",
		"beta.kubernetes.io/os":        "linux",
		"beta.kubernetes.io/arch":      "amd64",
		"kcp.overcommit.dev/fake-node": "true",
	}
	for k, v := range shape.Labels {
		labels[k] = v
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
		},
	}
	SetStatus(n, shape, now)
	return n
}

// SetStatus computes the status the kubelet would report, on top of the stored node: resources,
// conditions with a fresh heartbeat (healthy unless ConditionsAnnotation on n says otherwise;
// transition time kept when the status did not change), node info, images, addresses.
func SetStatus(n *corev1.Node, shape Shape, now metav1.Time) {
	n.Status.Capacity = shape.Capacity.DeepCopy()
	n.Status.Allocatable = shape.Allocatable.DeepCopy()
	n.Status.Phase = ""
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	n.Status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}
	sum := sha256.Sum256([]byte(n.Name))
	id := hex.EncodeToString(sum[:16])
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		MachineID:               id,
		SystemUUID:              id,
		BootID:                  id,
		KernelVersion:           "6.1.0-kcp-fake",
		OSImage:                 "kcp fake node",
		ContainerRuntimeVersion: "fake://1.0.0",
		KubeletVersion:          "v1.36.3",
		OperatingSystem:         "linux",
		Architecture:            "amd64",
	}
	n.Status.Images = imageList(shape.Images)
	scripted := scriptedConditions(n.Annotations[ConditionsAnnotation])
	for _, c := range kubeletConditions {
		status := c.healthy
		if s, ok := scripted[c.kind]; ok {
			if _, known := c.text[s]; known {
				status = s
			}
		}
		text := c.text[status]
		setCondition(n, c.kind, status, text.reason, text.message, now)
	}
}

// ConditionsAnnotation scripts a fake node's conditions for tests: a JSON object of condition
// type -> status, e.g. {"MemoryPressure":"True"}. The fake kubelet reads it from the stored
// Node at each status sync (where a kubelet reads its eviction signals) and reports those
// statuses with the kubelet's reasons and messages; a condition not named, a status the kubelet
// never reports for it, or a value that is not such an object leaves the healthy report.
const ConditionsAnnotation = "kcp.overcommit.dev/conditions"

type conditionText struct{ reason, message string }

// kubeletConditions are the conditions a kubelet reports, in its order, with its texts per
// status (pkg/kubelet/nodestatus/setters.go).
var kubeletConditions = []struct {
	kind    corev1.NodeConditionType
	healthy corev1.ConditionStatus
	text    map[corev1.ConditionStatus]conditionText
}{
	{corev1.NodeMemoryPressure, corev1.ConditionFalse, map[corev1.ConditionStatus]conditionText{
		corev1.ConditionFalse: {"KubeletHasSufficientMemory", "kubelet has sufficient memory available"},
		corev1.ConditionTrue:  {"KubeletHasInsufficientMemory", "kubelet has insufficient memory available"},
	}},
	{corev1.NodeDiskPressure, corev1.ConditionFalse, map[corev1.ConditionStatus]conditionText{
		corev1.ConditionFalse: {"KubeletHasNoDiskPressure", "kubelet has no disk pressure"},
		corev1.ConditionTrue:  {"KubeletHasDiskPressure", "kubelet has disk pressure"},
	}},
	{corev1.NodePIDPressure, corev1.ConditionFalse, map[corev1.ConditionStatus]conditionText{
		corev1.ConditionFalse: {"KubeletHasSufficientPID", "kubelet has sufficient PID available"},
		corev1.ConditionTrue:  {"KubeletHasInsufficientPID", "kubelet has insufficient PID available"},
	}},
	{corev1.NodeReady, corev1.ConditionTrue, map[corev1.ConditionStatus]conditionText{
		corev1.ConditionTrue:  {"KubeletReady", "kubelet is posting ready status"},
		corev1.ConditionFalse: {"KubeletNotReady", "scripted by " + ConditionsAnnotation},
	}},
}

// scriptedConditions parses ConditionsAnnotation's value; nil when absent or malformed.
func scriptedConditions(value string) map[corev1.NodeConditionType]corev1.ConditionStatus {
	if value == "" {
		return nil
	}
	var out map[corev1.NodeConditionType]corev1.ConditionStatus
	if err := json.Unmarshal([]byte(value), &out); err != nil {
		return nil
	}
	return out
}

func setCondition(n *corev1.Node, t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string, now metav1.Time) {
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != s {
			c.LastTransitionTime = now
		}
		c.Status, c.Reason, c.Message, c.LastHeartbeatTime = s, reason, msg, now
		return
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{
		Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now,
	})
}

// StatusChanged is the kubelet's nodeStatusHasChanged: any difference but heartbeat times.
func StatusChanged(a, b *corev1.NodeStatus) bool {
	if a == nil || b == nil {
		return a != b
	}
	if conditionsChanged(a.Conditions, b.Conditions) {
		return true
	}
	ac, bc := a.DeepCopy(), b.DeepCopy()
	ac.Conditions, bc.Conditions = nil, nil
	return !apiequality.Semantic.DeepEqual(ac, bc)
}

func conditionsChanged(a, b []corev1.NodeCondition) bool {
	if len(a) != len(b) {
		return true
	}
	ac := append([]corev1.NodeCondition(nil), a...)
	bc := append([]corev1.NodeCondition(nil), b...)
	sort.SliceStable(ac, func(i, j int) bool { return ac[i].Type < ac[j].Type })
	sort.SliceStable(bc, func(i, j int) bool { return bc[i].Type < bc[j].Type })
	for i := range ac {
		ac[i].LastHeartbeatTime, bc[i].LastHeartbeatTime = metav1.Time{}, metav1.Time{}
		if !apiequality.Semantic.DeepEqual(ac[i], bc[i]) {
			return true
		}
	}
	return false
}

// ParseResources turns "cpu=8,memory=32Gi" style pairs into a ResourceList.
func ParseResources(pairs map[string]string) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	for k, v := range pairs {
		if v == "" {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		out[corev1.ResourceName(k)] = q
	}
	return out, nil
}

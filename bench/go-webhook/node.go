package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

const (
	annotationRaw     = "overcommit.dev/raw-allocatable"
	annotationApplied = "overcommit.dev/applied"
	labelDisabled     = "overcommit.dev/disabled"
)

// applied is the JSON kept in overcommit.dev/applied.
type applied struct {
	Policy string            `json:"policy"`
	Ratios map[string]string `json:"ratios"`
}

// NodeCustomDefaulter inflates status.allocatable by policy, the way kube-overcommit does.
// Shaped as kubebuilder generates a CustomDefaulter.
type NodeCustomDefaulter struct {
	Policies []policy
}

var _ interface {
	Default(context.Context, runtime.Object) error
} = &NodeCustomDefaulter{}

// Default implements admission.CustomDefaulter. Errors are logged and the node is left
// untouched (fail open), never denied: node heartbeats must not be blocked.
func (d *NodeCustomDefaulter) Default(ctx context.Context, obj runtime.Object) error {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return fmt.Errorf("expected a Node object but got %T", obj)
	}
	if err := d.mutate(node); err != nil {
		logf.FromContext(ctx).Error(err, "node left unchanged", "node", node.Name)
	}
	return nil
}

func (d *NodeCustomDefaulter) mutate(node *corev1.Node) error {
	raw := rawAllocatable(node)
	pol := d.choose(node)
	if pol == nil {
		if len(raw) > 0 {
			node.Status.Allocatable = raw
		}
		delete(node.Annotations, annotationRaw)
		delete(node.Annotations, annotationApplied)
		if len(node.Annotations) == 0 {
			node.Annotations = nil
		}
		return nil
	}
	rawJSON, err := json.Marshal(quantityStrings(raw))
	if err != nil {
		return err
	}
	appliedJSON, err := json.Marshal(applied{Policy: pol.name, Ratios: pol.rawRatios})
	if err != nil {
		return err
	}
	node.Status.Allocatable = inflate(raw, pol.ratios)
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[annotationRaw] = string(rawJSON)
	node.Annotations[annotationApplied] = string(appliedJSON)
	return nil
}

// choose returns the highest-priority policy (ties by name) whose selector matches, or nil.
func (d *NodeCustomDefaulter) choose(node *corev1.Node) *policy {
	if node.Labels[labelDisabled] == "true" {
		return nil
	}
	set := labels.Set(node.Labels)
	for i := range d.Policies {
		p := &d.Policies[i]
		if len(p.ratios) > 0 && p.nodeSelector.Matches(set) {
			return p
		}
	}
	return nil
}

// rawAllocatable is the kubelet's own value: the annotation when the incoming allocatable is
// exactly what this webhook last wrote from it (no compounding), else the incoming value.
func rawAllocatable(node *corev1.Node) corev1.ResourceList {
	incoming := node.Status.Allocatable
	rawText, okRaw := node.Annotations[annotationRaw]
	appliedText, okApplied := node.Annotations[annotationApplied]
	if !okRaw || !okApplied {
		return incoming
	}
	var rawStrings map[string]string
	var last applied
	if json.Unmarshal([]byte(rawText), &rawStrings) != nil || json.Unmarshal([]byte(appliedText), &last) != nil {
		return incoming
	}
	prev := corev1.ResourceList{}
	for k, v := range rawStrings {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return incoming
		}
		prev[corev1.ResourceName(k)] = q
	}
	ratios := map[string]*big.Rat{}
	for k, v := range last.Ratios {
		r, ok := new(big.Rat).SetString(v)
		if !ok {
			return incoming
		}
		ratios[k] = r
	}
	if sameQuantities(incoming, inflate(prev, ratios)) {
		return prev
	}
	return incoming
}

// inflate returns floor(raw x ratio) per resource: cpu in whole millicores, everything else
// in whole units (bytes, pods, devices).
func inflate(raw corev1.ResourceList, ratios map[string]*big.Rat) corev1.ResourceList {
	out := make(corev1.ResourceList, len(raw))
	for name, q := range raw {
		r, ok := ratios[string(name)]
		if !ok {
			out[name] = q.DeepCopy()
			continue
		}
		if name == corev1.ResourceCPU {
			out[name] = *resource.NewMilliQuantity(floorMul(q.MilliValue(), r), resource.DecimalSI)
		} else {
			out[name] = *resource.NewQuantity(floorMul(q.Value(), r), q.Format)
		}
	}
	return out
}

func floorMul(v int64, r *big.Rat) int64 {
	n := new(big.Int).Mul(big.NewInt(v), r.Num())
	return new(big.Int).Div(n, r.Denom()).Int64() // Euclidean division: floor for v >= 0
}

func sameQuantities(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, qa := range a {
		qb, ok := b[k]
		if !ok || qa.Cmp(qb) != 0 {
			return false
		}
	}
	return true
}

func quantityStrings(l corev1.ResourceList) map[string]string {
	out := make(map[string]string, len(l))
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	for _, k := range keys {
		q := l[corev1.ResourceName(k)]
		out[k] = q.String()
	}
	return out
}

package main

import (
	"context"
	"fmt"
	"math/big"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// PodDefaults mirrors spec.podDefaults of the product's OvercommitPolicy.
// Which namespaces get them is decided by the API server (the webhook configuration's
// namespaceSelector), as in the product; the highest-priority policy with podDefaults applies.
type PodDefaults struct {
	Requests              map[string]string `json:"requests,omitempty"`
	RequestToLimitPercent map[string]int64  `json:"requestToLimitPercent,omitempty"`
}

type podRules struct {
	defaults corev1.ResourceList
	percent  map[corev1.ResourceName]int64
}

func parsePodDefaults(name string, d *PodDefaults) (*podRules, error) {
	r := &podRules{defaults: corev1.ResourceList{}, percent: map[corev1.ResourceName]int64{}}
	for k, v := range d.Requests {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("policy %s: podDefaults.requests[%s]: %w", name, k, err)
		}
		r.defaults[corev1.ResourceName(k)] = q
	}
	for k, v := range d.RequestToLimitPercent {
		if v < 1 || v > 100 {
			return nil, fmt.Errorf("policy %s: podDefaults.requestToLimitPercent[%s]=%d: want 1..100", name, k, v)
		}
		r.percent[corev1.ResourceName(k)] = v
	}
	return r, nil
}

// PodCustomDefaulter gives pods default requests and request-to-limit ratios, the way
// kube-overcommit does. Shaped as kubebuilder generates a CustomDefaulter.
type PodCustomDefaulter struct {
	Policies     []policy
	OwnNamespace string
}

func (d *PodCustomDefaulter) Default(ctx context.Context, obj runtime.Object) error {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return fmt.Errorf("expected a Pod object but got %T", obj)
	}
	namespace := pod.Namespace
	if req, err := admissionRequestFrom(ctx); err == nil && req.Namespace != "" {
		namespace = req.Namespace
	}
	// Left alone: kube-system, the webhook's own namespace, Guaranteed pods, and pods with
	// pod-level resources (their containers' requests must fit them).
	if namespace == "kube-system" || namespace == d.OwnNamespace || guaranteed(pod) || pod.Spec.Resources != nil {
		return nil
	}
	rules := d.choose()
	if rules == nil {
		return nil
	}
	for i := range pod.Spec.InitContainers {
		rules.apply(&pod.Spec.InitContainers[i].Resources)
	}
	for i := range pod.Spec.Containers {
		rules.apply(&pod.Spec.Containers[i].Resources)
	}
	logf.FromContext(ctx).V(1).Info("pod defaulted", "pod", pod.GenerateName+pod.Name)
	return nil
}

func (d *PodCustomDefaulter) choose() *podRules {
	for i := range d.Policies {
		if r := d.Policies[i].pods; r != nil {
			return r
		}
	}
	return nil
}

func (r *podRules) apply(res *corev1.ResourceRequirements) {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		limit, hasLimit := res.Limits[name]
		if pct, ok := r.percent[name]; ok && hasLimit {
			setRequest(res, name, percentOf(name, limit, pct))
			continue
		}
		if _, hasRequest := res.Requests[name]; hasRequest || hasLimit {
			continue // an explicit request stays; with a limit, Kubernetes' request = limit stays
		}
		if def, ok := r.defaults[name]; ok {
			setRequest(res, name, def.DeepCopy())
		}
	}
}

func setRequest(res *corev1.ResourceRequirements, name corev1.ResourceName, q resource.Quantity) {
	if res.Requests == nil {
		res.Requests = corev1.ResourceList{}
	}
	res.Requests[name] = q
}

// percentOf is floor(limit x pct / 100): cpu in whole millicores, memory in whole bytes.
func percentOf(name corev1.ResourceName, limit resource.Quantity, pct int64) resource.Quantity {
	r := big.NewRat(pct, 100)
	if name == corev1.ResourceCPU {
		return *resource.NewMilliQuantity(floorMul(limit.MilliValue(), r), resource.DecimalSI)
	}
	return *resource.NewQuantity(floorMul(limit.Value(), r), limit.Format)
}

// guaranteed: every container sets cpu and memory limits and its requests (where set) equal them.
func guaranteed(pod *corev1.Pod) bool {
	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			limit, ok := c.Resources.Limits[name]
			if !ok {
				return false
			}
			if req, ok := c.Resources.Requests[name]; ok && req.Cmp(limit) != 0 {
				return false
			}
		}
	}
	return len(all) > 0
}

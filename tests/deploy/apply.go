package deploytest

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// FieldManager is the server-side apply field manager of these tests.
const FieldManager = "kube-overcommit-deploy-test"

// Applier applies rendered manifests with server-side apply, as `kubectl apply --server-side` does.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func NewApplier(cfg *rest.Config) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

func (a *Applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, *meta.RESTMapping, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		// A CRD applied a moment ago: refresh discovery once.
		a.mapper.Reset()
		m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", Key(o), err)
		}
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			return nil, nil, fmt.Errorf("%s: namespaced kind without a namespace", Key(o))
		}
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), m, nil
	}
	if o.GetNamespace() != "" {
		return nil, nil, fmt.Errorf("%s: cluster-scoped kind with a namespace", Key(o))
	}
	return a.dyn.Resource(m.Resource), m, nil
}

// Apply server-side-applies every object; CustomResourceDefinitions first, waiting until they are
// Established, so that objects of their kinds in the same stream can be applied.
func (a *Applier) Apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	for _, o := range crds {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, o := range crds {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := a.dyn.Resource(crdGVR).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				cm, _ := c.(map[string]any)
				if cm["type"] == "Established" && cm["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not Established: %w", o.GetName(), err)
		}
	}
	if len(crds) > 0 {
		a.mapper.Reset()
	}
	for _, o := range rest {
		if err := a.applyOne(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func (a *Applier) applyOne(ctx context.Context, o *unstructured.Unstructured) error {
	ri, _, err := a.resource(o)
	if err != nil {
		return err
	}
	if _, err := ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("server-side apply %s: %w", Key(o), err)
	}
	return nil
}

// Delete removes every object (namespaced ones first, Namespaces and CRDs last) and waits until
// each is gone.
func (a *Applier) Delete(ctx context.Context, objs []*unstructured.Unstructured) error {
	order := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "Namespace":
			return 2
		case "CustomResourceDefinition":
			return 3
		}
		return 1
	}
	for pass := 1; pass <= 3; pass++ {
		for _, o := range objs {
			if order(o) != pass {
				continue
			}
			ri, _, err := a.resource(o)
			if err != nil {
				if meta.IsNoMatchError(err) {
					continue // its CRD is already gone
				}
				return err
			}
			bg := metav1.DeletePropagationBackground
			if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete %s: %w", Key(o), err)
			}
			err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
				_, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
			if err != nil {
				return fmt.Errorf("%s still present after delete: %w", Key(o), err)
			}
		}
	}
	return nil
}

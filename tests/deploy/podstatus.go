package deploytest

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// PodStatusLoop stands in for the kubelet's pod side on fake nodes, for one namespace: the fake
// nodes of tests/cluster keep node status and Leases alive but run no pods. A pod bound to a
// node is reported Running and Ready, as a kubelet does once its containers start and the
// readiness probe passes; a pod marked for deletion is removed, as a kubelet does once its
// containers have exited. Readiness is what the PodDisruptionBudget and the Deployment count.
type PodStatusLoop struct {
	client kubernetes.Interface
	ns     string
	// ReadyAfter delays readiness after binding, like a container start plus the first readiness
	// probe; it keeps a replacement unready long enough for a test to see the PDB hold.
	ReadyAfter time.Duration

	mu     sync.Mutex
	errors []error
}

func NewPodStatusLoop(client kubernetes.Interface, ns string, readyAfter time.Duration) *PodStatusLoop {
	return &PodStatusLoop{client: client, ns: ns, ReadyAfter: readyAfter}
}

// Errors returns the API errors the loop met (conflicts excluded: it retries on the next event).
func (l *PodStatusLoop) Errors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errors...)
}

func (l *PodStatusLoop) record(err error) {
	if err == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return
	}
	l.mu.Lock()
	l.errors = append(l.errors, err)
	l.mu.Unlock()
}

// Run watches the namespace's pods until ctx ends.
func (l *PodStatusLoop) Run(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(l.client, 0, informers.WithNamespace(l.ns))
	inf := f.Core().V1().Pods().Informer()
	work := make(chan string, 1024)
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			select {
			case work <- p.Name:
			default:
			}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
	})
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	// Pods whose readiness is due later are looked at again on this tick.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-work:
			if obj, ok, _ := inf.GetStore().GetByKey(l.ns + "/" + name); ok {
				l.handle(ctx, obj.(*corev1.Pod))
			}
		case <-tick.C:
			for _, obj := range inf.GetStore().List() {
				l.handle(ctx, obj.(*corev1.Pod))
			}
		}
	}
}

func (l *PodStatusLoop) handle(ctx context.Context, p *corev1.Pod) {
	switch {
	case p.DeletionTimestamp != nil:
		zero := int64(0)
		l.record(l.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &p.UID},
		}))
	case p.Spec.NodeName == "" || isReady(p):
		return
	default:
		bound := boundAt(p)
		if time.Since(bound) < l.ReadyAfter {
			return
		}
		now := metav1.Now()
		st := p.DeepCopy()
		st.Status.Phase = corev1.PodRunning
		if st.Status.StartTime == nil {
			st.Status.StartTime = &now
		}
		for _, t := range []corev1.PodConditionType{corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			setCondition(st, t, now)
		}
		st.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			started := true
			st.Status.ContainerStatuses = append(st.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: &started,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		_, err := l.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, st, metav1.UpdateOptions{})
		l.record(err)
	}
}

func boundAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}

func setCondition(p *corev1.Pod, t corev1.PodConditionType, now metav1.Time) {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			if p.Status.Conditions[i].Status != corev1.ConditionTrue {
				p.Status.Conditions[i].Status = corev1.ConditionTrue
				p.Status.Conditions[i].LastTransitionTime = now
			}
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

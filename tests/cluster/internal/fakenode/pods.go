package fakenode

import (
	"context"
	"fmt"
	"hash/fnv"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// runPods plays the kubelet's pod side, minimally: a pod bound to one of our nodes is marked
// Running and Ready (no container runs), and a pod being deleted is removed at once, as the
// kubelet confirms a deletion once its containers stopped.
func runPods(ctx context.Context, client kubernetes.Interface, nodes map[string]bool, filter func(*corev1.Pod) bool, box *statsBox) {
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Core().V1().Pods().Informer()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !nodes[pod.Spec.NodeName] || (filter != nil && !filter(pod)) {
			return
		}
		if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
			q.Add(key)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
	})
	factory.Start(ctx.Done())
	go func() { <-ctx.Done(); q.ShutDown() }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		obj, exists, err := inf.GetIndexer().GetByKey(key)
		if err == nil && exists {
			err = syncPod(ctx, client, obj.(*corev1.Pod), box)
		}
		if err != nil && ctx.Err() == nil {
			log.Printf("pod %s: %v", key, err)
			box.with(func(s *Stats) { s.PodFailures++ })
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

func syncPod(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, box *statsBox) error {
	pods := client.CoreV1().Pods(pod.Namespace)
	if pod.DeletionTimestamp != nil {
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		if err == nil {
			box.with(func(s *Stats) { s.PodsDeleted++ })
		}
		return err
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "" {
		return nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID || cur.DeletionTimestamp != nil || (cur.Status.Phase != corev1.PodPending && cur.Status.Phase != "") {
			return nil
		}
		markRunning(cur)
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		box.with(func(s *Stats) { s.PodsStarted++ })
	}
	return err
}

func markRunning(pod *corev1.Pod) {
	now := metav1.NewTime(time.Now())
	ip := PodIP(pod.UID)
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP = "127.0.0.1"
	pod.Status.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.StartTime = &now
	set := func(t corev1.PodConditionType) {
		for i := range pod.Status.Conditions {
			if pod.Status.Conditions[i].Type == t {
				pod.Status.Conditions[i].Status = corev1.ConditionTrue
				pod.Status.Conditions[i].LastTransitionTime = now
				return
			}
		}
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		set(t)
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:        c.Name,
			Image:       c.Image,
			ImageID:     c.Image,
			ContainerID: fmt.Sprintf("fake://%s-%s", pod.UID, c.Name),
			Ready:       true,
			Started:     ptr.To(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
}

// PodIP is the made-up address a fake kubelet reports for a pod: pod IPs must not be loopback
// (EndpointSlice validation rejects it), so it is a 10.128.0.0/9 address derived from the UID.
func PodIP(uid types.UID) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(uid))
	v := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", 128+int(v>>24)%128, (v>>16)&0xff, 1+int(v&0xff)%254)
}

package e2e

// Quiet heartbeats on Kubernetes' own kubelet code (issue 33): Node writes (new
// resourceVersions, each a write to etcd) per node per minute, from a watch of every stored
// version, before any policy (the kubelet writes its unchanged status once per report period)
// and with the webhook inflating the nodes (the stored allocatable now differs from the
// kubelet's own, so it PATCHes at every status update; quiet heartbeats store those as nothing).

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// watchNodes keeps every stored version of every node from now on.
func watchNodes(t *testing.T, ctx context.Context, cs kubernetes.Interface) *history[*corev1.Node] {
	t.Helper()
	return watchHistory(t, ctx, func(ctx context.Context) ([]*corev1.Node, string, error) {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", err
		}
		return pointers(l.Items), l.ResourceVersion, nil
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return cs.CoreV1().Nodes().Watch(ctx, o)
	})
}

// writesPerMinute is the mean Node writes per node per minute in (from, to], and what they were.
func writesPerMinute(h *history[*corev1.Node], names []string, from, to time.Time) (float64, string) {
	n := 0
	var what []string
	for _, name := range names {
		for _, w := range nodeWrites(h, name, from, to) {
			n++
			what = append(what, w.what)
		}
	}
	return float64(n) / float64(len(names)) / to.Sub(from).Minutes(), strings.Join(what, "; ")
}

// checkQuietWrites compares the writes per node per minute of the window before the policy
// (`before`) with a window of two report periods with the webhook inflating.
func checkQuietWrites(t *testing.T, h *history[*corev1.Node], names []string, before [2]time.Time) {
	t.Helper()
	without, _ := writesPerMinute(h, names, before[0], before[1])
	from := time.Now()
	length := 2 * hollowReport
	time.Sleep(length) // the measurement window itself, not a wait for a condition
	with, what := writesPerMinute(h, names, from, time.Now())
	t.Logf("Node writes per node per minute: %.2f without overcommit (%s window), %.2f with the webhook inflating (%s window: %s); kubelet status update every %s, report every %s",
		without, before[1].Sub(before[0]).Round(time.Second), with, length.Round(time.Second), what, hollowUpdate, hollowReport)
	if without == 0 {
		t.Errorf("no Node writes before the policy: the watch saw nothing")
	}
	if with > without {
		t.Errorf("with the webhook %.2f Node writes per node per minute, without %.2f: quiet heartbeats do not hold on the kubelet", with, without)
	}
}

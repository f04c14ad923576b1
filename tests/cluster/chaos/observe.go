package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
)

// pollFakeNodeStats adds the fake nodes' per-write counters (attempts, failures, slow writes,
// errors naming x509 or a webhook, mutated writes) to the current phase, as deltas, every
// second. A status write is mutated when the Node the API server returned for it has another
// allocatable than the fake kubelet sent: the webhook answered. (Whether the write reached etcd
// does not matter: with quiet heartbeats most writes are no-ops there, and the Node returned
// is then the stored, inflated one; a write that failed open stores, and returns, the kubelet's
// value. The fake nodes' "mutated" counter is not used: it looks at an annotation that stays on
// the Node after a write the webhook never saw.)
func pollFakeNodeStats(ctx context.Context, wg *sync.WaitGroup, t *Tally, path string) {
	defer wg.Done()
	var last harness.FakeNodeStats
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		// One last read after ctx ends: the fake nodes write their stats file when they stop.
		done := ctx.Err() != nil
		if s, err := harness.ReadFakeNodeStats(path); err == nil {
			cur, prev := s.StatusWrites, last.StatusWrites
			if s.PID != last.PID && last.PID != 0 {
				prev = harness.FakeNodeStats{}.StatusWrites
			}
			t.Add(func(p *Phase) {
				p.Writes += cur.Attempts - prev.Attempts
				p.Failed += cur.Failures - prev.Failures
				p.Slow += cur.Slow - prev.Slow
				p.WebhookErrs += cur.WebhookErrors - prev.WebhookErrors
				p.ClientX509 += cur.X509Errors - prev.X509Errors
				p.Mutated += cur.Overridden - prev.Overridden
				p.NotMutated += cur.NotOverridden - prev.NotOverridden
			})
			if cur.Failures > prev.Failures {
				progress("status write failed: %s", cur.LastError)
			}
			last = s
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// webhookNameSuffix ends the names of the webhooks of the configuration
// (nodes.overcommit.dev, pods.overcommit.dev): the API server labels its metrics with them.
const webhookNameSuffix = `overcommit.dev"`

// capWebhookName is the placement cap's validating webhook (bindings.cap.overcommit.dev): it
// fails open by design (a placement goes through when the cap cannot answer), so its
// fail-opens are counted apart from the mutating webhooks' (the "100% mutated" invariant).
const capWebhookName = `.cap.overcommit.dev"`

// webhookMetrics are the API server's admission webhook counters for our webhooks.
type webhookMetrics struct {
	failOpen, rejected, capFailOpen float64
}

// scrapeAPIServerMetrics reads the API server's /metrics with the admin credentials every
// 2 s and adds the growth of the fail-open and rejection counters of webhooks whose name
// contains webhookName to the current phase (a counter that went down is a restarted API
// server: its whole value is growth).
func scrapeAPIServerMetrics(ctx context.Context, wg *sync.WaitGroup, t *Tally, client kubernetes.Interface, webhookName string) {
	defer wg.Done()
	var last *webhookMetrics
	warned := false
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		done := ctx.Err() != nil
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(sctx)
		cancel()
		if err != nil {
			if !warned && apierrors.IsForbidden(err) {
				t.Note("API server /metrics forbidden (%v): fail-open counts unavailable", err)
				warned = true
			}
		} else {
			m := parseWebhookMetrics(string(body), webhookName)
			if last != nil {
				growth := func(now, before float64) int64 {
					if now < before {
						return int64(now)
					}
					return int64(now - before)
				}
				fo, rj := growth(m.failOpen, last.failOpen), growth(m.rejected, last.rejected)
				cfo := growth(m.capFailOpen, last.capFailOpen)
				t.Add(func(p *Phase) { p.FailOpen += fo; p.Rejected += rj; p.CapFailOpen += cfo })
			}
			last = &m
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

func parseWebhookMetrics(text, webhookName string) webhookMetrics {
	var m webhookMetrics
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") || !strings.Contains(line, webhookName) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "apiserver_admission_webhook_fail_open_count{") && strings.Contains(line, capWebhookName):
			m.capFailOpen += v
		case strings.HasPrefix(line, "apiserver_admission_webhook_fail_open_count{"):
			m.failOpen += v
		case strings.HasPrefix(line, "apiserver_admission_webhook_rejection_count{"):
			m.rejected += v
		}
	}
	return m
}

// tailLogs reads the new lines of every file files() names every second and adds the count
// of lines that match to the current phase. A file that shrank was rewritten: read from 0.
func tailLogs(ctx context.Context, wg *sync.WaitGroup, t *Tally, files func() []string, match func(string) bool, add func(p *Phase, n int64), show string) {
	defer wg.Done()
	offsets := map[string]int64{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		done := ctx.Err() != nil
		for _, f := range files() {
			n, sample := scanNew(f, offsets, match)
			if n > 0 {
				t.Add(func(p *Phase) { add(p, n) })
				progress("%s: %d new line(s), e.g. %s", show, n, sample)
			}
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

func scanNew(path string, offsets map[string]int64, match func(string) bool) (int64, string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, ""
	}
	off := offsets[path]
	if st.Size() < off {
		off = 0
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, ""
	}
	var n int64
	sample := ""
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // a partial last line is read again next time
		}
		off += int64(len(line))
		if match(line) {
			n++
			if sample == "" {
				sample = strings.TrimSpace(line)
				if len(sample) > 300 {
					sample = sample[:300]
				}
			}
		}
	}
	offsets[path] = off
	return n, sample
}

// x509InAPIServerLog matches the API server's log of a webhook call that failed on TLS trust.
func x509InAPIServerLog(line string) bool {
	return (strings.Contains(line, "x509") || strings.Contains(line, "failed to verify certificate")) &&
		strings.Contains(line, "webhook")
}

// x509InReplicaLog matches a replica's log of a TLS handshake the client aborted with an
// alert (what the API server does when it does not trust the certificate).
func x509InReplicaLog(line string) bool {
	return strings.Contains(line, "TLS handshake failed") &&
		(strings.Contains(line, "alert") || strings.Contains(line, "ertificate"))
}

// createPods keeps creating small pods in namespace ns (one every interval), deleting the
// oldest beyond keep, and counts creations that worked and failed in the current phase.
func createPods(ctx context.Context, wg *sync.WaitGroup, t *Tally, client kubernetes.Interface, ns string, interval time.Duration, keep int, selector map[string]string, tolerations []corev1.Toleration) {
	defer wg.Done()
	live := &livePods{pods: client.CoreV1().Pods(ns), keep: keep}
	failures := 0
	everyTick(ctx, interval, live, func(i int) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chaos-%d-%d", time.Now().Unix()%100000, i), Namespace: ns,
				Labels: map[string]string{"app": "chaos-load"}},
			Spec: corev1.PodSpec{
				NodeSelector: selector, Tolerations: tolerations,
				TerminationGracePeriodSeconds: ptr.To(int64(0)),
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")},
						Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}},
			},
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := client.CoreV1().Pods(ns).Create(cctx, pod, metav1.CreateOptions{})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			t.Add(func(p *Phase) { p.PodsFailed++ })
			if failures == 1 || failures%20 == 0 {
				progress("pod create failed (%d so far): %v", failures, err)
			}
			return
		}
		t.Add(func(p *Phase) { p.PodsCreated++ })
		live.add(ctx, pod.Name)
	})
}

// everyTick calls step with 0, 1, 2, ... every interval until ctx ends, then deletes the pods
// live holds.
func everyTick(ctx context.Context, interval time.Duration, live *livePods, step func(i int)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			live.deleteAll()
			return
		case <-tick.C:
		}
		step(i)
	}
}

// livePods are the pods a load keeps: the oldest beyond keep are deleted as new ones come, the
// rest at the end.
type livePods struct {
	pods  corev1client.PodInterface
	names []string
	keep  int
}

var deleteNow = metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}

func (l *livePods) add(ctx context.Context, name string) {
	l.names = append(l.names, name)
	for len(l.names) > l.keep {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = l.pods.Delete(dctx, l.names[0], deleteNow)
		cancel()
		l.names = l.names[1:]
	}
}

func (l *livePods) deleteAll() {
	dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range l.names {
		_ = l.pods.Delete(dctx, name, deleteNow)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// waitFor polls f every interval until it returns nil, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout, interval time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v: %w", what, timeout, err)
		}
		if !sleepCtx(ctx, interval) {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}

// placementScheduler is the schedulerName of the pods placePods binds itself: no scheduler
// runs by that name, so the binding is this load's own.
const placementScheduler = "chaos-manual-binder"

// placePods keeps placing small pods on the capped nodes (round robin over nodes), one every
// interval, alternating two ways the cap webhook checks: a pod created with spec.nodeName,
// and a pod created unscheduled (placementScheduler) then bound through pods/binding. The
// oldest beyond keep are deleted. A placement that worked counts in PlacedOK; a create or a
// binding that failed counts in PlacedFailed (the cap has room: with failurePolicy Ignore, no
// replica being down may make one fail).
func placePods(ctx context.Context, wg *sync.WaitGroup, t *Tally, client kubernetes.Interface, ns string, nodes []string, interval time.Duration, keep int) {
	defer wg.Done()
	pods := client.CoreV1().Pods(ns)
	live := &livePods{pods: pods, keep: keep}
	failures := 0
	everyTick(ctx, interval, live, func(i int) {
		node := nodes[i%len(nodes)]
		bind := i%2 == 1
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("placed-%d-%d", time.Now().Unix()%100000, i), Namespace: ns,
				Labels: map[string]string{"app": "chaos-placed"}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To(int64(0)),
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}}},
			},
		}
		if bind {
			pod.Spec.SchedulerName = placementScheduler
		} else {
			pod.Spec.NodeName = node
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := pods.Create(cctx, pod, metav1.CreateOptions{})
		if err != nil {
			err = fmt.Errorf("create %s on %s: %w", pod.Name, node, err)
		} else {
			live.add(ctx, pod.Name)
			if bind {
				err = pods.Bind(cctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name},
					Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
				if err != nil {
					err = fmt.Errorf("bind %s to %s: %w", pod.Name, node, err)
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			t.Add(func(p *Phase) { p.PlacedFailed++ })
			if failures == 1 || failures%20 == 0 {
				progress("placement failed (%d so far): %v", failures, err)
			}
			return
		}
		t.Add(func(p *Phase) { p.PlacedOK++ })
	})
}

// capAnswers waits until a replica's cap webhook refuses a placement over the cap (a dry-run
// create of a pod asking more cpu than the cap on one of the nodes): the validating webhook
// configuration is in place and a replica's node cache holds the node, so the placement load
// does go through the cap check. Dry run: nothing is stored, no ledger entry is kept. Run
// before the API server metrics are scraped (the refusals are not counted as rejections).
func capAnswers(ctx context.Context, client kubernetes.Interface, ns, node string) (string, error) {
	var msg string
	err := waitFor(ctx, 60*time.Second, 500*time.Millisecond, "the cap webhook refuses a placement over the cap", func() error {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "over-the-cap", Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node,
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1000")}}}}},
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := client.CoreV1().Pods(ns).Create(cctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return fmt.Errorf("allowed (the cap webhook is not in place yet, or its replica does not know the node)")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), node) {
			return fmt.Errorf("refused, but not by the cap: %w", err)
		}
		msg = err.Error()
		return nil
	})
	return msg, err
}

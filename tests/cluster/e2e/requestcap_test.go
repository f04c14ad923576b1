package e2e

// Issue 17 end to end, the webhook configuration of the placement cap: with `serve
// --request-cap` the leader keeps a ValidatingWebhookConfiguration (same name as the mutating
// one) pointing at /validate through the Service, with the same caBundle; it repairs hand edits
// and deletion; a CA rotation puts the new CA into both caBundles before any leaf comes from it
// and drops the old one from both; restarted without --request-cap, the leader deletes it.
// Pods are refused through it with the cap's message (replicas reached by the API server
// through the Service resolver, as in the leader tests).

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

// capPolicy: raw cpu x 1.1 for the scheduler, and a cap at 110% of raw.
const capPolicy = `  nodeRatios:
    cpu: "1.1"
  requestCap:
    cpu: "110%"
`

// capNode registers a node as a kubelet does (status on create): raw cpu 4, with the test's
// label, so the policy caps it at 4.4. No kubelet runs it: pods placed there stay Pending
// (still counted: they are bound and not terminal).
func capNode(t *testing.T, ctx context.Context, name, ns string) {
	t.Helper()
	if _, err := shared.Client.CoreV1().Nodes().Create(ctx, capNodeObject(name, ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = shared.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func capNodeObject(name, ns string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{koNodeLabelKey: ns}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourcePods: resource.MustParse("110")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourcePods: resource.MustParse("110")},
		},
	}
}

// placedPod asks `cpu` ("" for none) on `node` (spec.nodeName set at create).
func placedPod(name, node, cpu string) *corev1.Pod {
	c := corev1.Container{Name: "app", Image: "registry.invalid/app"}
	if cpu != "" {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{c},
		},
	}
}

// sameBundle: the CA certificates of a caBundle, compared as certificates.
func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func containsCert(bundle []*x509.Certificate, c *x509.Certificate) bool {
	for _, b := range bundle {
		if b.Equal(c) {
			return true
		}
	}
	return false
}

// capConfig is the validating configuration, read; its caBundle parsed (the webhooks' must be
// equal).
func capConfig(ctx context.Context, name string) (*admissionregistrationv1.ValidatingWebhookConfiguration, []*x509.Certificate, error) {
	cfg, err := shared.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	if len(cfg.Webhooks) == 0 {
		return cfg, nil, fmt.Errorf("no webhooks")
	}
	for _, w := range cfg.Webhooks[1:] {
		if !bytes.Equal(w.ClientConfig.CABundle, cfg.Webhooks[0].ClientConfig.CABundle) {
			return cfg, nil, fmt.Errorf("webhook %s has another caBundle", w.Name)
		}
	}
	return cfg, pemCerts(cfg.Webhooks[0].ClientConfig.CABundle), nil
}

func TestRequestCapWebhookConfiguration(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 8*time.Minute)
	ns := uniqueName("ko-cap")
	rs := startReplicasWithPolicy(t, ctx, ns, 2, capPolicy,
		"--request-cap", "--leaf-validity", "10m", "--ca-validity", "1h")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	vwcs := shared.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()

	// Created by the leader, with the mutating configuration's caBundle.
	var orig *admissionregistrationv1.ValidatingWebhookConfiguration
	if err := harness.Eventually(15*time.Second, 100*time.Millisecond, func() error {
		cfg, bundle, err := capConfig(ctx, ns)
		if err != nil {
			return err
		}
		p, err := readPKI(ctx, ns)
		if err != nil {
			return err
		}
		if !sameCerts(bundle, p.bundle) {
			return fmt.Errorf("caBundle differs from the mutating configuration's")
		}
		orig = cfg
		return nil
	}); err != nil {
		t.Fatalf("validating configuration: %v", err)
	}
	var shape []string
	for _, w := range orig.Webhooks {
		var rules []string
		for _, r := range w.Rules {
			rules = append(rules, fmt.Sprintf("%v %s", r.Operations, strings.Join(r.Resources, ",")))
		}
		svc := w.ClientConfig.Service
		shape = append(shape, fmt.Sprintf("%s %s %d %s %s/%s%s:%d [%s] conditions=%d", w.Name, *w.FailurePolicy, *w.TimeoutSeconds,
			*w.SideEffects, svc.Namespace, svc.Name, *svc.Path, *svc.Port, strings.Join(rules, "; "), len(w.MatchConditions)))
	}
	want := []string{
		fmt.Sprintf("bindings.cap.overcommit.dev Ignore 2 None %s/%s/validate:443 [[CREATE] pods/binding; [CREATE] bindings] conditions=0", ns, koService),
		fmt.Sprintf("placed-pods.cap.overcommit.dev Ignore 2 None %s/%s/validate:443 [[CREATE] pods] conditions=2", ns, koService),
	}
	if strings.Join(shape, "\n") != strings.Join(want, "\n") {
		t.Fatalf("validating configuration:\n%s\nwant:\n%s", strings.Join(shape, "\n"), strings.Join(want, "\n"))
	}

	// Enforced through it: a pod over the cap on its own is refused with the rule's message.
	node := ns + "-node"
	capNode(t, ctx, node, ns)
	podNS := ns + "-pods"
	createNamespace(t, ctx, podNS)
	pods := shared.Client.CoreV1().Pods(podNS)
	waitCapCalled(t, ctx, podNS, "probe", node)

	asOrig := func() error {
		got, err := vwcs.Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(got.Webhooks) != len(orig.Webhooks) {
			return fmt.Errorf("%d webhooks", len(got.Webhooks))
		}
		for i, w := range got.Webhooks {
			o := orig.Webhooks[i]
			if *w.FailurePolicy != *o.FailurePolicy || *w.TimeoutSeconds != *o.TimeoutSeconds ||
				!bytes.Equal(w.ClientConfig.CABundle, o.ClientConfig.CABundle) || len(w.Rules) != len(o.Rules) ||
				len(w.MatchConditions) != len(o.MatchConditions) {
				return fmt.Errorf("webhook %s still drifted", w.Name)
			}
		}
		return nil
	}

	// Hand edits: failurePolicy Fail, a long timeout, a garbage caBundle, rules and conditions gone.
	cfg := orig.DeepCopy()
	cfg.Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
	cfg.Webhooks[0].TimeoutSeconds = ptr.To(int32(30))
	cfg.Webhooks[1].ClientConfig.CABundle = []byte("garbage")
	cfg.Webhooks[1].MatchConditions = nil
	cfg.Webhooks[0].Rules = cfg.Webhooks[0].Rules[:1]
	if _, err := vwcs.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin(t, "edited validating configuration", 5*time.Second, asOrig)
	if err := vwcs.Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repairedWithin(t, "deleted validating configuration", 5*time.Second, asOrig)

	// A CA rotation: at every look, the CA of the serving leaf is in both caBundles (so is the
	// CA of any leaf a replica may still serve: the old CA is dropped only once every ready
	// replica serves a leaf from the new one); at the end both hold the new CA alone. Pods with
	// spec.nodeName are created meanwhile: no call to either configuration may fail.
	before, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	countsBefore, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rotated := make(chan error, 1)
	go func() {
		rotate := exec.Command(rs.in.Binary, "rotate", "--ca", "--namespace", ns, "--wait", "90s")
		rotate.Env = append(os.Environ(), "KUBECONFIG="+shared.Kubeconfig)
		out, err := rotate.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("rotate --ca: %v: %s", err, out)
		}
		rotated <- err
	}()
	var (
		looks, created int
		loadErr        error
		loadMu         sync.Mutex
		loadDone       = make(chan struct{})
		stopLoad       = make(chan struct{})
	)
	go func() {
		defer close(loadDone)
		for i := 0; ; i++ {
			select {
			case <-stopLoad:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_, err := pods.Create(ctx, placedPod(fmt.Sprintf("during-rotation-%d", i), node, ""), metav1.CreateOptions{})
			loadMu.Lock()
			if err != nil && loadErr == nil {
				loadErr = err
			} else if err == nil {
				created++
			}
			loadMu.Unlock()
		}
	}()
	// Until the rotation has finished: the request taken, a new CA alone, every replica ready.
	var rotateErr error
	taken := false
	phases := map[string]bool{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the CA rotation did not finish in 90 s (phases seen: %v)", phases)
		}
		select {
		case rotateErr = <-rotated:
			taken = true
			if rotateErr != nil {
				t.Fatal(rotateErr)
			}
		case <-time.After(100 * time.Millisecond):
		}
		p, err := readPKI(ctx, ns)
		if err != nil {
			continue // (a Secret being rewritten)
		}
		phases[p.phase] = true
		if taken && p.current != nil && !p.current.Equal(before.current) && rs.settled(ctx) == nil {
			break
		}
		_, vBundle, err := capConfig(ctx, ns)
		if err != nil {
			t.Fatalf("validating configuration during the rotation: %v", err)
		}
		looks++
		if p.leaf == nil {
			continue
		}
		for _, ca := range []*x509.Certificate{p.current, p.next} {
			if ca != nil && p.leaf.CheckSignatureFrom(ca) == nil {
				if !containsCert(vBundle, ca) || !containsCert(p.bundle, ca) {
					t.Fatalf("look %d (phase %q): the serving leaf's CA is missing from a caBundle (validating %d CAs, mutating %d)",
						looks, p.phase, len(vBundle), len(p.bundle))
				}
			}
		}
	}
	close(stopLoad)
	<-loadDone
	if !phases["published"] || !phases["switched"] {
		t.Fatalf("the rotation's phases were not all seen: %v", phases)
	}
	after, err := readPKI(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if after.current.Equal(before.current) {
		t.Fatal("the CA did not change")
	}
	if err := harness.Eventually(10*time.Second, 100*time.Millisecond, func() error {
		_, vBundle, err := capConfig(ctx, ns)
		if err != nil {
			return err
		}
		if len(vBundle) != 1 || !vBundle[0].Equal(after.current) {
			return fmt.Errorf("validating caBundle holds %d CAs, not just the new one", len(vBundle))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	countsAfter, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	loadMu.Lock()
	if loadErr != nil {
		t.Fatalf("a pod with spec.nodeName was refused during the rotation: %v", loadErr)
	}
	if created == 0 {
		t.Fatal("no pod was created during the rotation")
	}
	t.Logf("CA rotation: %d looks, %d pods created through the validating webhook; API server webhook counts %+v -> %+v",
		looks, created, countsBefore, countsAfter)
	loadMu.Unlock()
	if countsAfter.FailOpen != countsBefore.FailOpen || countsAfter.Other != countsBefore.Other {
		t.Fatalf("CA rotation: a webhook call failed: API server webhook counts went from %+v to %+v", countsBefore, countsAfter)
	}

	// Turned off: replicas restarted without --request-cap; the leader deletes the configuration
	// it kept (the mutating one stays).
	var args []string
	for _, a := range rs.in.Args {
		if a != "--request-cap" {
			args = append(args, a)
		}
	}
	rs.in.Args = args
	for _, r := range rs.in.Replicas() {
		if err := r.Restart(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error {
		_, err := vwcs.Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there")
	}); err != nil {
		t.Fatalf("without --request-cap the validating configuration stays: %v", err)
	}
	t.Logf("without --request-cap: the validating configuration deleted %v after the restart", time.Since(start).Round(time.Millisecond))
	// Every replica back and ready first: the restarts above may still be starting one, whose
	// metrics port is not listening yet.
	if err := harness.Eventually(60*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("after turning the cap off: %v", err)
	}
	// Counted by the leader that deleted it (once: the check is once per term).
	deleted := 0.0
	for _, r := range rs.in.Replicas() {
		m, err := replicaMetrics(r)
		if err != nil {
			t.Fatal(err)
		}
		deleted += m[`kube_overcommit_config_repairs_total{object="validating-webhook-configuration",action="deleted"}`]
	}
	if deleted != 1 {
		t.Errorf("config_repairs_total{object=\"validating-webhook-configuration\",action=\"deleted\"} summed over the replicas: %v, want 1", deleted)
	}
}

// waitCapCalled waits until the API server calls the cap's webhook (its configuration loaded
// there) and the replicas know node (raw cpu 4, cap 4.4, nothing on it yet): a pod `name` asking 5
// cpu, created on node, is refused with the cap's message. One admitted before that is deleted
// at once (a graceful deletion would leave it terminating, still counted, on a node without a
// kubelet).
func waitCapCalled(t *testing.T, ctx context.Context, podNS, name, node string) {
	t.Helper()
	pods := shared.Client.CoreV1().Pods(podNS)
	refusal := "node " + node + ": cpu requests would exceed the node's placement cap; pod " + name + " asks 5"
	if err := harness.Eventually(60*time.Second, 100*time.Millisecond, func() error {
		_, err := pods.Create(ctx, placedPod(name, node, "5"), metav1.CreateOptions{})
		if err == nil {
			_ = pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			return fmt.Errorf("pod %s admitted", name)
		}
		if !strings.Contains(err.Error(), refusal) {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("the cap's webhook never refused %s on %s: %v", name, node, err)
	}
}

// pendingPod asks `cpu` and waits for a binding: its scheduler does not exist.
func pendingPod(name, cpu string) *corev1.Pod {
	p := placedPod(name, "", cpu)
	p.Spec.SchedulerName = "nobody"
	return p
}

// validateBinding sends one replica the AdmissionReview of a pods/binding CREATE of ns/name to
// node, as the API server would; returns its answer. (Use it only for bindings it refuses: an
// allowed one is counted in the replica's ledger.)
func validateBinding(ctx context.Context, r *install.Replica, ns, name, node string) (bool, string, error) {
	review := map[string]any{
		"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
		"request": map[string]any{
			"uid": "e2e-" + name, "operation": "CREATE",
			"kind":        map[string]any{"group": "", "version": "v1", "kind": "Binding"},
			"resource":    map[string]any{"group": "", "version": "v1", "resource": "pods"},
			"subResource": "binding", "name": name, "namespace": ns,
			"userInfo": map[string]any{"username": "e2e"},
			"object": map[string]any{"apiVersion": "v1", "kind": "Binding",
				"metadata": map[string]any{"name": name, "namespace": ns},
				"target":   map[string]any{"apiVersion": "v1", "kind": "Node", "name": node}},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		return false, "", err
	}
	// The replica's leaf is checked by the API server elsewhere; here only its answer matters.
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+r.Listen+"/validate", bytes.NewReader(body))
	if err != nil {
		return false, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	var out struct {
		Response struct {
			Allowed bool `json:"allowed"`
			Status  struct {
				Message string `json:"message"`
			} `json:"status"`
		} `json:"response"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return false, "", fmt.Errorf("replica %s /validate: %s: %v", r.Identity(), resp.Status, err)
	}
	return out.Response.Allowed, out.Response.Status.Message, nil
}

// burstResult is one burst of concurrent bindings to one node.
type burstResult struct {
	bound, refused int
	// boundMilli is the cpu requests (millicores) of the pods bound to the node afterwards.
	boundMilli int64
	took       time.Duration
	// perReplica: the burst's reviews answered by each replica.
	perReplica []int
}

// bindBurst creates n pending pods asking `cpu` each, waits until the pod index of every replica
// has them (a sentinel pod created after them, larger than the cap on its own, is refused by
// every replica: the watch delivers events in order), then binds all n to node at once.
// Refusals must carry the cap's message.
func bindBurst(t *testing.T, ctx context.Context, in *replicaSet, podNS, prefix, node string, n int, cpu string) burstResult {
	t.Helper()
	pods := shared.Client.CoreV1().Pods(podNS)
	// The API server calls the webhook (its configuration is loaded there) and the node is
	// known: a pod over the cap on its own, created on the node, is refused.
	waitCapCalled(t, ctx, podNS, prefix+"-probe", node)
	for i := 0; i < n; i++ {
		if _, err := pods.Create(ctx, pendingPod(fmt.Sprintf("%s-%d", prefix, i), cpu), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sentinel := prefix + "-sentinel"
	if _, err := pods.Create(ctx, pendingPod(sentinel, "5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := func(name string) error {
		return pods.Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name},
			Target: corev1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{})
	}
	// Every replica's index holds the pods: the sentinel's binding, reviewed by each replica
	// directly (the API server would pick one), is refused by all. (A replica that has not seen
	// the sentinel yet allows it without counting it anywhere.)
	if err := harness.Eventually(60*time.Second, 50*time.Millisecond, func() error {
		for _, r := range in.in.Replicas() {
			allowed, msg, err := validateBinding(ctx, r, podNS, sentinel, node)
			if err != nil {
				return err
			}
			if allowed || !strings.Contains(msg, "cpu requests would exceed") {
				return fmt.Errorf("replica %s: allowed %v %q", r.Identity(), allowed, msg)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the pod index never held the burst's pods: %v", err)
	}

	var (
		mu     sync.Mutex
		res    burstResult
		wg     sync.WaitGroup
		start  = make(chan struct{})
		others []string
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			<-start
			err := bind(name)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				res.bound++
			case strings.Contains(err.Error(), "node "+node+": cpu requests would exceed the node's placement cap; pod "+name+" asks"):
				res.refused++
			default:
				others = append(others, err.Error())
			}
		}(fmt.Sprintf("%s-%d", prefix, i))
	}
	reviews := func() []float64 {
		var out []float64
		for _, r := range in.in.Replicas() {
			m, err := replicaMetrics(r)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m[`kube_overcommit_placement_reviews_total{outcome="allowed"}`]+m[`kube_overcommit_placement_reviews_total{outcome="denied"}`])
		}
		return out
	}
	before := reviews()
	t0 := time.Now()
	close(start)
	wg.Wait()
	res.took = time.Since(t0)
	for i, v := range reviews() {
		res.perReplica = append(res.perReplica, int(v-before[i]))
	}
	if len(others) > 0 {
		t.Fatalf("bindings failed otherwise than by the cap: %v", others)
	}
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		for _, c := range p.Spec.Containers {
			res.boundMilli += c.Resources.Requests.Cpu().MilliValue()
		}
	}
	return res
}

// Issue 17's burst: 40 bindings of 200m at once to one node capped at 4.4 cpu. With one
// replica, its ledger counts each allowed binding before the watch shows it: exactly 22 bound
// (4.4), 18 refused with the cap's message. With two replicas (the API server spreads calls over
// its connections to both), each counts only its own bindings in flight: the overshoot is
// measured and logged (README, "The placement cap's webhook").
func TestRequestCapBurst(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 6*time.Minute)
	ns := uniqueName("ko-burst")
	rs := startReplicasWithPolicy(t, ctx, ns, 1, capPolicy, "--request-cap")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	podNS := ns + "-pods"
	createNamespace(t, ctx, podNS)

	one := ns + "-one"
	capNode(t, ctx, one, ns)
	r := bindBurst(t, ctx, rs, podNS, "one", one, 40, "200m")
	t.Logf("one replica: %d bound, %d refused in %v (reviews %v); %dm bound on the node (cap 4400m)", r.bound, r.refused, r.took.Round(time.Millisecond), r.perReplica, r.boundMilli)
	if r.bound != 22 || r.refused != 18 || r.boundMilli != 4400 {
		t.Errorf("one replica: %d bound (%dm), %d refused; want exactly 22 (4400m) and 18", r.bound, r.boundMilli, r.refused)
	}

	if _, err := rs.in.AddReplica(); err != nil {
		t.Fatal(err)
	}
	if err := rs.in.WaitReady(2, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// The API server keeps its connections to the first replica (HTTP/1.1, reused): restart
	// it, so that new connections are dialled, spread over both replicas by the Service.
	if err := rs.in.Replica(0).Restart(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := rs.in.WaitReady(2, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := shared.WaitBackendsReady(ns, koService, 2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	two := ns + "-two"
	capNode(t, ctx, two, ns)
	r = bindBurst(t, ctx, rs, podNS, "two", two, 40, "200m")
	t.Logf("two replicas: %d bound, %d refused in %v (reviews per replica %v); %dm bound on the node (cap 4400m): overshoot %dm",
		r.bound, r.refused, r.took.Round(time.Millisecond), r.perReplica, r.boundMilli, r.boundMilli-4400)
	if r.bound+r.refused != 40 || r.bound < 22 {
		t.Errorf("two replicas: %d bound, %d refused", r.bound, r.refused)
	}
	// Each replica allows at most up to the cap on what it sees: never more than twice the cap.
	if r.boundMilli > 2*4400 {
		t.Errorf("two replicas: %dm bound, more than one cap per replica", r.boundMilli)
	}

	// Webhook down (every replica stopped, the configuration left in place): placement fails
	// open. A pod over the cap is created on the full node at once, and the API server counts a
	// fail-open call of the cap's webhook.
	if err := rs.in.Stop(); err != nil {
		t.Fatal(err)
	}
	before, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := shared.Client.CoreV1().Pods(podNS).Create(ctx, placedPod("while-down", one, "5"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("with the webhook down, a pod over the cap must be admitted (fail open): %v", err)
	}
	took := time.Since(t0)
	after, err := apiserverWebhookCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.FailOpen <= before.FailOpen {
		t.Errorf("no fail-open call counted by the API server: %+v -> %+v", before, after)
	}
	t.Logf("webhook down: a pod over the cap admitted in %v (fail open; API server counts %+v -> %+v)", took.Round(time.Millisecond), before, after)
}

// Pods created with generateName and spec.nodeName, 40 at once on one node capped at 4.4 (200m
// each): the API server generates the name (and uid) before validating admission (the registry's
// BeforeCreate runs between mutating and validating admission), so the cap sees and counts each
// pod under its own name, and holds exactly as for named pods: 22 created, 18 refused, each
// refusal naming a generated pod (never the bare prefix, which would make every pod one ledger
// entry and let the burst through). Then a binding of a pod the index does not hold is decided
// on one GET of the pod, counted in kube_overcommit_placement_pod_reads_total.
func TestRequestCapGenerateName(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 4*time.Minute)
	ns := uniqueName("ko-gen")
	rs := startReplicasWithPolicy(t, ctx, ns, 1, capPolicy, "--request-cap")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	podNS := ns + "-pods"
	createNamespace(t, ctx, podNS)
	node := ns + "-node"
	capNode(t, ctx, node, ns)
	waitCapCalled(t, ctx, podNS, "gen-probe", node)

	pods := shared.Client.CoreV1().Pods(podNS)
	const prefix = "gen-"
	generated := regexp.MustCompile(`; pod (` + prefix + `[a-z0-9]{5}) asks 0\.2`)
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		start   = make(chan struct{})
		created = map[string]bool{}
		refused = map[string]bool{}
		others  []string
	)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := placedPod("", node, "200m")
			p.GenerateName = prefix
			<-start
			got, err := pods.Create(ctx, p, metav1.CreateOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				created[got.Name] = true
				return
			}
			m := generated.FindStringSubmatch(err.Error())
			if m == nil || !strings.Contains(err.Error(), "node "+node+": cpu requests would exceed the node's placement cap") {
				others = append(others, err.Error())
				return
			}
			refused[m[1]] = true
		}()
	}
	close(start)
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("creates failed otherwise than by the cap naming a generated pod: %v", others)
	}
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var milli int64
	for _, p := range list.Items {
		for _, c := range p.Spec.Containers {
			milli += c.Resources.Requests.Cpu().MilliValue()
		}
	}
	t.Logf("generateName burst: %d created, %d refused (distinct generated names); %dm on the node (cap 4400m)", len(created), len(refused), milli)
	if len(created) != 22 || len(refused) != 18 || milli != 4400 {
		t.Errorf("%d created, %d refused, %dm on the node; want exactly 22, 18 and 4400m", len(created), len(refused), milli)
	}

	// A binding naming a pod the replica's index does not hold is decided on one GET of the
	// pod from this API server: one that does not exist is allowed (the API server refuses the
	// binding itself) and the read is counted.
	replica := rs.in.Replicas()[0]
	notFound := `kube_overcommit_placement_pod_reads_total{result="not_found"}`
	before, err := replicaMetrics(replica)
	if err != nil {
		t.Fatal(err)
	}
	allowed, msg, err := validateBinding(ctx, replica, podNS, "never-created", node)
	if err != nil || !allowed {
		t.Fatalf("binding of a pod that does not exist: allowed %v %q %v", allowed, msg, err)
	}
	after, err := replicaMetrics(replica)
	if err != nil {
		t.Fatal(err)
	}
	if after[notFound] != before[notFound]+1 {
		t.Errorf("%s: %v -> %v, want one more read", notFound, before[notFound], after[notFound])
	}
}

// The default scheduler follows allocatable while the cap refuses the bindings beyond it: a
// node (a fake kubelet: raw cpu 4, inflated to 4.4 by the policy at registration) whose
// allocatable an admin then sets to 8 (a status write not by the node, so not reviewed: README,
// "Which writes the webhooks see"; the kubelet writes again only after 10 minutes here). The
// scheduler sees room for 8 pods of 1 cpu and binds them; the cap (110% of the raw 4) lets 4
// through and refuses the rest, which stay Pending with the cap's message in their condition.
func TestRequestCapRefusesTheScheduler(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 5*time.Minute)
	ns := uniqueName("ko-sched")
	rs := startReplicasWithPolicy(t, ctx, ns, 1, capPolicy, "--request-cap")
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error { return rs.settled(ctx) }); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	// The node's registration must be reviewed (inflated, raw annotation written): wait until
	// the API server calls the mutating webhook, with a node made by hand and deleted again.
	probe := ns + "-probe"
	if err := harness.Eventually(60*time.Second, 200*time.Millisecond, func() error {
		n, err := shared.Client.CoreV1().Nodes().Create(ctx, capNodeObject(probe, ns), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if err := shared.Client.CoreV1().Nodes().Delete(ctx, probe, metav1.DeleteOptions{}); err != nil {
			return err
		}
		if q := n.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse("4400m")) != 0 {
			return fmt.Errorf("a registration stored cpu %s, not inflated", q.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	nodes := startTestNodes(t, ns, 1, "--labels="+koNodeLabelKey+"="+ns, "--cpu=8", "--allocatable-cpu=4",
		"--status-update-frequency=10m", "--status-report-frequency=10m")
	node := nodes.Names[0]
	inflated := func(n *corev1.Node) error {
		if q := n.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse("4400m")) != 0 {
			return fmt.Errorf("allocatable cpu %s", q.String())
		}
		return rawAnnotation("4")(n)
	}
	if err := waitNode(ctx, shared.Client, node, 60*time.Second, nodeReady, inflated); err != nil {
		t.Fatalf("registration not inflated by the policy: %v", err)
	}
	patch := []byte(`{"status":{"allocatable":{"cpu":"8"}}}`)
	if _, err := shared.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if err := waitNode(ctx, shared.Client, node, 10*time.Second, func(n *corev1.Node) error {
		if q := n.Status.Allocatable[corev1.ResourceCPU]; q.Cmp(resource.MustParse("8")) != 0 {
			return fmt.Errorf("allocatable cpu %s", q.String())
		}
		return rawAnnotation("4")(n)
	}); err != nil {
		t.Fatal(err)
	}

	podNS := ns + "-pods"
	createNamespace(t, ctx, podNS)
	pods := shared.Client.CoreV1().Pods(podNS)
	// The webhook is called (configuration loaded in the API server, node in the cache).
	waitCapCalled(t, ctx, podNS, "probe", node)
	for i := 0; i < 8; i++ {
		p := placedPod(fmt.Sprintf("sched-%d", i), "", "1")
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	capMessage := "node " + node + ": cpu requests would exceed the node's placement cap; pod"
	var last string
	if err := harness.Eventually(90*time.Second, 250*time.Millisecond, func() error {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		bound, refused := 0, 0
		for _, p := range list.Items {
			if p.Spec.NodeName == node {
				bound++
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, capMessage) {
					refused++
				}
			}
		}
		last = fmt.Sprintf("%d bound, %d refused by the cap", bound, refused)
		if bound > 4 {
			t.Fatalf("%s: the cap let the scheduler past 4.4 cpu", last)
		}
		if bound != 4 || refused != 4 {
			return fmt.Errorf("%s", last)
		}
		return nil
	}); err != nil {
		t.Fatalf("want 4 pods bound and 4 refused by the cap (scheduler condition): %v", err)
	}
	t.Logf("scheduler with allocatable 8 on a node capped at 4.4: %s", last)
	// The node's Event: the refusals counted by resource, no pod or namespace named.
	out, err := describedWith(shared, 30*time.Second, "node", node, "PlacementCapDenied", "the placement cap refused", "(cpu: ")
	if err != nil {
		t.Fatal(err)
	}
	denied := regexp.MustCompile(`PlacementCapDenied +\S+ +overcommit.dev/kube-overcommit +(.*)`).FindStringSubmatch(out)
	if len(denied) != 2 || !regexp.MustCompile(`^the placement cap refused \d+ pod placements? on this node \(cpu: \d+\)$`).MatchString(strings.TrimSpace(denied[1])) {
		t.Errorf("the node's PlacementCapDenied Event says more than counts by resource (no pod, namespace or figure): %q", denied)
	}
	t.Logf("kubectl describe node %s:\n%s", node, eventsSection(out))
}

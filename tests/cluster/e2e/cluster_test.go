package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/runfiles"
)

func createNamespace(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	_, err := shared.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = shared.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// A 3-replica Deployment's pods are scheduled onto the fake nodes by the real scheduler, and
// the fake kubelets make them Running so the Deployment becomes available.
func TestDeploymentScheduledOnFakeNodes(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 4*time.Minute)
	ns := "e2e-deploy"
	// The nodes must be schedulable first: a new node carries the not-ready taint until the
	// node lifecycle controller's first pass, and a pod refused for it waits in the
	// scheduler's unschedulable queue for a node event.
	for i := 0; i < 3; i++ {
		if err := waitNode(ctx, shared.Client, fmt.Sprintf("node-%d", i), time.Minute, nodeReady, untainted); err != nil {
			logClusterState(t, ns)
			t.Fatal(err)
		}
	}
	createNamespace(t, ctx, ns)
	labels := map[string]string{"app": "web"}
	_, err := shared.Client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "web", Image: "registry.example.invalid/web:1",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("256Mi"),
					}},
				}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create deployment: %v", err)
	}
	nodes := map[string]bool{}
	for i := 0; i < 3; i++ {
		nodes[fmt.Sprintf("node-%d", i)] = true
	}
	err = harness.Eventually(2*time.Minute, 200*time.Millisecond, func() error {
		pods, err := shared.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		scheduled := 0
		for _, p := range pods.Items {
			if nodes[p.Spec.NodeName] && p.Status.Phase == corev1.PodRunning {
				scheduled++
			}
		}
		if scheduled != 3 {
			return fmt.Errorf("%d of 3 pods running on fake nodes: %s", scheduled, describePods(pods.Items))
		}
		d, err := shared.Client.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas != 3 {
			return fmt.Errorf("deployment has %d available replicas", d.Status.AvailableReplicas)
		}
		return nil
	})
	if err != nil {
		logClusterState(t, ns)
		t.Fatal(err)
	}
}

// logClusterState logs the shared cluster's nodes (readiness, taints, allocatable), the events
// of ns and the components' last log lines, so that a scheduling failure says what the
// scheduler, the controllers and the fake kubelets saw.
func logClusterState(t *testing.T, ns string) {
	t.Helper()
	shared.DumpLogs(t, 40, "scheduler", "controller-manager", "fake-nodes", "supervisor")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if nodes, err := shared.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nodes.Items {
			alloc := n.Status.Allocatable
			t.Logf("node %s ready=%q unschedulable=%v taints=%v allocatable cpu=%s memory=%s", n.Name, nodeCondition(&n, corev1.NodeReady).Status,
				n.Spec.Unschedulable, n.Spec.Taints, alloc.Cpu(), alloc.Memory())
		}
	}
	if events, err := shared.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range events.Items {
			t.Logf("event %s/%s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// describePods says where each pod is and why, for a failure message: name, node, phase,
// and the message of each condition that is not true.
func describePods(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "\n  %s node=%q phase=%s deleting=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	return b.String()
}

// testCA is a CA and a serving certificate for <svc>.<ns>.svc, like the webhook's own.
func testCA(t *testing.T, dnsName string) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	return caAndLeaf(t, "e2e-webhook-ca", &x509.Certificate{
		Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// caAndLeaf makes a new CA named caName and a leaf from tmpl (subject, names, extended key
// usage) signed by it, both valid from an hour ago for a day.
func caAndLeaf(t *testing.T, caName string, tmpl *x509.Certificate) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(2)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	leafDER, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

// webhookServer answers node reviews with a JSON patch that sets an annotation and doubles
// allocatable cpu; it counts the reviews by operation and subresource.
type webhookServer struct {
	creates, statusUpdates atomic.Int64
	serverNames            atomic.Value
}

func (w *webhookServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 10<<20))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	if r.TLS != nil {
		w.serverNames.Store(r.TLS.ServerName)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, "bad review", http.StatusBadRequest)
		return
	}
	req := review.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	var node corev1.Node
	if req.Kind.Kind == "Node" && json.Unmarshal(req.Object.Raw, &node) == nil {
		switch {
		case req.Operation == admissionv1.Create:
			w.creates.Add(1)
		case req.Operation == admissionv1.Update && req.SubResource == "status":
			w.statusUpdates.Add(1)
		}
		cpu := node.Status.Allocatable[corev1.ResourceCPU]
		doubled := resource.NewMilliQuantity(cpu.MilliValue()*2, resource.DecimalSI)
		patch := []map[string]any{}
		if node.Annotations == nil {
			patch = append(patch, map[string]any{"op": "add", "path": "/metadata/annotations", "value": map[string]string{}})
		}
		patch = append(patch, map[string]any{"op": "add", "path": "/metadata/annotations/overcommit.dev~1applied", "value": "true"})
		if _, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
			patch = append(patch, map[string]any{"op": "replace", "path": "/status/allocatable/cpu", "value": doubled.String()})
		}
		data, _ := json.Marshal(patch)
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = data, &pt
	}
	review.Response = resp
	review.Request = nil
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(review)
}

// The API server calls a MutatingWebhookConfiguration's Service (resolved to a local HTTPS
// server through the file registry, TLS ServerName <svc>.<ns>.svc) when a fake node registers
// and PATCHes its status, and the patch lands in the stored Node. Without a ready backend the
// API server fails open and the kubelet's own value comes back.
func TestWebhookMutatesFakeNodeStatus(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, 3*time.Minute)
	const ns, svc = "e2e-webhook", "overcommit-test"
	caPEM, cert := testCA(t, svc+"."+ns+".svc")
	hook := &webhookServer{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: hook, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	var ready atomic.Bool
	ready.Store(true)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	readySrv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			rw.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	go func() { _ = readySrv.Serve(rl) }()
	t.Cleanup(func() { _ = readySrv.Close() })

	backend := harness.Backend{Addr: l.Addr().String(), Port: 443, ReadyURL: "http://" + rl.Addr().String() + "/readyz"}
	if err := shared.AddBackend(ns, svc, backend); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.RemoveBackend(ns, svc, backend.Addr, 0) })
	if err := shared.WaitBackendsReady(ns, svc, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	prefix := "hooked"
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"e2e-webhook": "on"}}
	_, err = shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-overcommit"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "nodes.e2e.overcommit.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{
				Service:  &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svc, Path: ptr.To("/mutate"), Port: ptr.To(int32(443))},
				CABundle: caPEM,
			},
			Rules: []admissionregistrationv1.RuleWithOperations{
				{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}}},
				{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes/status"}}},
			},
			ObjectSelector:          selector,
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(int32(2)),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create webhook configuration: %v", err)
	}
	t.Cleanup(func() {
		_ = shared.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), "e2e-overcommit", metav1.DeleteOptions{})
	})
	// The webhook configuration reaches the API server's admission chain through an informer.
	// Only then start the node, so that its registration is reviewed too.
	probe := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "e2e-webhook-probe", Labels: map[string]string{"e2e-webhook": "on"}}}
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		n, err := shared.Client.CoreV1().Nodes().Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return err
		}
		if n.Annotations["overcommit.dev/applied"] != "true" {
			return fmt.Errorf("webhook not active yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	nodes, err := shared.StartFakeNodes(harness.FakeNodesOptions{Prefix: prefix, Count: 1, Args: []string{
		"--labels=e2e-webhook=on", "--cpu=8", "--allocatable-cpu=4", "--status-update-frequency=1s", "--images=50",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = nodes.Stop()
		_ = shared.Client.CoreV1().Nodes().Delete(context.Background(), nodes.Names[0], metav1.DeleteOptions{})
	})
	name := nodes.Names[0]
	// Registration (CREATE) and status PATCHes both go through the webhook: the stored node has
	// the annotation and allocatable cpu 8 (4 reported, doubled).
	err = harness.Eventually(60*time.Second, 200*time.Millisecond, func() error {
		n, err := shared.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		if n.Annotations["overcommit.dev/applied"] != "true" || cpu.Cmp(resource.MustParse("8")) != 0 {
			return fmt.Errorf("node %s: annotation %q allocatable cpu %s", name, n.Annotations["overcommit.dev/applied"], cpu.String())
		}
		if hook.creates.Load() == 0 || hook.statusUpdates.Load() < 2 {
			return fmt.Errorf("webhook saw %d creates, %d status updates", hook.creates.Load(), hook.statusUpdates.Load())
		}
		st, err := nodes.Stats()
		if err != nil {
			return err
		}
		if st.StatusWrites.Mutated < 2 || st.StatusWrites.Overridden < 2 {
			return fmt.Errorf("fake node saw %d mutated status writes", st.StatusWrites.Mutated)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := hook.serverNames.Load(); got != svc+"."+ns+".svc" {
		t.Errorf("TLS ServerName %v, want %s", got, svc+"."+ns+".svc")
	}

	// The replica dies: it turns unready (the resolver has no endpoint left) and its connections
	// close. The API server fails open (failurePolicy Ignore): the status write still succeeds
	// and carries the kubelet's own value. (Unready alone is not enough: like kube-proxy, the
	// resolver only picks backends for new connections, and the API server keeps its
	// connections alive.)
	ready.Store(false)
	_ = srv.Close()
	if err := shared.WaitBackendsReady(ns, svc, 0, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := nodes.Stats()
	if err != nil {
		t.Fatal(err)
	}
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		n, err := shared.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		if cpu.Cmp(resource.MustParse("4")) != 0 {
			return fmt.Errorf("allocatable cpu %s, want the kubelet's 4", cpu.String())
		}
		st, err := nodes.Stats()
		if err != nil {
			return err
		}
		if st.StatusWrites.NotOverridden == before.StatusWrites.NotOverridden || st.StatusWrites.Failures != before.StatusWrites.Failures {
			return fmt.Errorf("status writes: %+v", st.StatusWrites)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Once the stored status equals what the fake kubelet computes, it stops writing until the
// report interval (a kubelet without a mutating webhook patches every 5 minutes, not every 10 s).
func TestFakeNodeWritesOnlyOnChange(t *testing.T) {
	onShared(t)
	nodes, err := shared.StartFakeNodes(harness.FakeNodesOptions{Prefix: "quiet", Count: 2, Args: []string{"--status-update-frequency=500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = nodes.Stop()
		for _, n := range nodes.Names {
			_ = shared.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	var st harness.FakeNodeStats
	err = harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		st, err = nodes.Stats()
		if err != nil {
			return err
		}
		if st.Skipped < 6 || st.LeaseRenewals < 2 {
			return fmt.Errorf("skipped %d, lease renewals %d", st.Skipped, st.LeaseRenewals)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Registrations.Attempts != 2 || st.StatusWrites.Attempts != 0 {
		t.Fatalf("want 2 registrations and no status patch while nothing changed; got %+v / %+v", st.Registrations, st.StatusWrites)
	}
	for _, n := range nodes.Names {
		if _, err := shared.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(context.Background(), n, metav1.GetOptions{}); err != nil {
			t.Errorf("lease of %s: %v", n, err)
		}
	}
}

// The Secret-volume writer lays the Secret out like the kubelet (..data symlink to a
// timestamped directory, one symlink per key) and swaps ..data when the Secret changes.
func TestSecretVolumeSwapsData(t *testing.T) {
	onShared(t)
	ctx := harness.Context(t, time.Minute)
	ns := "e2e-secret"
	createNamespace(t, ctx, ns)
	secrets := shared.Client.CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls"}, Data: map[string][]byte{"tls.crt": []byte("one")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	vol, err := shared.StartSecretVolume(ns, "tls", dir, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vol.Stop() })
	read := func(want string) error {
		data, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
		if err != nil {
			return err
		}
		if string(data) != want {
			return fmt.Errorf("tls.crt = %q, want %q", data, want)
		}
		return nil
	}
	if err := harness.Eventually(20*time.Second, 100*time.Millisecond, func() error { return read("one") }); err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(filepath.Join(dir, "tls.crt"))
	if err != nil || link != "..data/tls.crt" {
		t.Fatalf("tls.crt links to %q (%v), want ..data/tls.crt", link, err)
	}
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil || !strings.HasPrefix(first, "..20") {
		t.Fatalf("..data links to %q (%v), want a timestamped directory", first, err)
	}
	if _, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls"}, Data: map[string][]byte{"tls.crt": []byte("two"), "tls.key": []byte("k")}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(20*time.Second, 100*time.Millisecond, func() error { return read("two") }); err != nil {
		t.Fatal(err)
	}
	second, _ := os.Readlink(filepath.Join(dir, "..data"))
	if second == first {
		t.Fatalf("..data still points at %s", first)
	}
	// The writer removes the old directory right after the swap the read above saw.
	if err := harness.Eventually(5*time.Second, 50*time.Millisecond, func() error {
		if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
			return fmt.Errorf("old data directory %s not removed (%v)", first, err)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// kcp restart apiserver: the supervisor brings the API server back and clients recover.
func TestRestartAPIServer(t *testing.T) {
	onShared(t)
	if shared.External {
		t.Skip("restarting a control plane this test did not start is not its business")
	}
	if err := shared.Restart("apiserver"); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(30*time.Second, 200*time.Millisecond, func() error {
		_, err := shared.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := shared.Kcp("status"); err != nil {
		t.Fatalf("kcp status: %v\n%s", err, out)
	}
}

// kubectl is built into kcp and talks to the control plane.
func TestKubectl(t *testing.T) {
	onShared(t)
	out, err := shared.Kubectl("get", "nodes", "-o", "name")
	if err != nil {
		t.Fatalf("kubectl: %v\n%s", err, out)
	}
	for i := 0; i < 3; i++ {
		if !strings.Contains(out, fmt.Sprintf("node/node-%d", i)) {
			t.Errorf("kubectl get nodes lacks node-%d:\n%s", i, out)
		}
	}
}

// A crash of the supervisor takes its children with it (Pdeathsig), and kcp down removes
// everything else of the run directory (here a standalone secret-volume and fake-nodes), so
// nothing is left: checked by scanning /proc and with pgrep.
func TestDownLeavesNothingAfterCrash(t *testing.T) {
	ownControlPlane(t)
	if os.Getenv("KCP_KUBECONFIG") != "" {
		t.Skip("needs its own control plane")
	}
	c := harness.Start(t, harness.Options{Nodes: 1})
	nodes, err := c.StartFakeNodes(harness.FakeNodesOptions{Prefix: "extra"})
	if err != nil {
		t.Fatal(err)
	}
	vol, err := c.StartSecretVolume("default", "absent", t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = vol
	procs := c.Processes()
	if len(procs) < 7 {
		t.Fatalf("want supervisor, etcd, apiserver, scheduler, controller-manager, 2x fake-nodes, secret-volume; got %v", procs)
	}
	sup, err := runfiles.Dir(c.RunDir).ReadPid("supervisor")
	if err != nil {
		t.Fatal(err)
	}
	// Crash the supervisor: its children die with it.
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = harness.Eventually(20*time.Second, 100*time.Millisecond, func() error {
		for _, p := range c.Processes() {
			if p.Subcommand != "fake-nodes" && p.Subcommand != "secret-volume" {
				return fmt.Errorf("still running after the supervisor crashed: %v", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.Kcp("down"); err != nil {
		t.Fatalf("kcp down: %v\n%s", err, out)
	}
	if left := c.Processes(); len(left) > 0 {
		t.Fatalf("left after kcp down: %v", left)
	}
	_ = nodes
	out, err := exec.Command("pgrep", "-af", c.RunDir).CombinedOutput()
	if err == nil {
		t.Fatalf("pgrep still finds processes of %s:\n%s", c.RunDir, out)
	}
	var ee *exec.ExitError
	if !errorsAs(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("pgrep: %v %s", err, bytes.TrimSpace(out))
	}
}

// A control plane whose owner died (a test binary killed by its -timeout) stops by itself.
func TestStopsWhenOwnerGone(t *testing.T) {
	ownControlPlane(t)
	bin, err := harness.Binary()
	if err != nil {
		t.Fatal(err)
	}
	owner := exec.Command("sleep", "300")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	run := runfiles.Dir(t.TempDir())
	t.Cleanup(func() {
		_ = owner.Process.Kill()
		_ = exec.Command(bin, "down", "--run-dir="+string(run)).Run()
	})
	out, err := exec.Command(bin, "up", "--run-dir="+string(run), fmt.Sprintf("--exit-with-pid=%d", owner.Process.Pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("kcp up: %v\n%s", err, out)
	}
	if n := len(run.Processes()); n != 5 {
		t.Fatalf("want 5 processes, got %v", run.Processes())
	}
	_ = owner.Process.Kill()
	_, _ = owner.Process.Wait()
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		if left := run.Processes(); len(left) > 0 {
			return fmt.Errorf("still running: %v", left)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
